"""Search QA (Search-R1 / PaperSearchQA): :class:`SearchEnv`, its question and corpus files, retrieval (a local BM25
index, a client and a server of Search-R1's ``/retrieve``) and a closed set built from recorded trajectories."""

from deltattg.envs.search.env import SearchEnv

__all__ = ["SearchEnv"]
