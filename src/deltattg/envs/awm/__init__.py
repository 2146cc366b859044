"""Agent World Model (AWM): :class:`AWMEnv` over AWM's released files (:mod:`.release`), each episode in its own
sandbox of database, MCP server and verifier (:mod:`.sandbox`, :mod:`.mcp_client`); example scenarios in
:mod:`.examples`. Extra ``[awm]``."""

from deltattg.envs.awm.env import AWMEnv

__all__ = ["AWMEnv"]
