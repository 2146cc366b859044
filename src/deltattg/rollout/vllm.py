"""The rollout engine's vLLM backend (optional extra ``[vllm]``, GPU): the same ``ChatPolicy`` as the HF actor —
same prompts, same ``Action`` records — with generation by ``vllm.LLM``. Not exercised in CI (no GPU there).

Log-probs: vLLM returns those of the sampled tokens with ``SamplingParams(logprobs=0)``; ``logprobs_mode=
"processed_logprobs"`` makes them the temperature-scaled distribution, the convention of :class:`LMPolicy`. The
trainer recomputes old log-probs with the actor anyway (as verl does), so these are for logging and checks.
"""

from __future__ import annotations

from typing import Any

from deltattg.rollout.engine import Action
from deltattg.rollout.policies import ChatPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig


class VLLMPolicy(ChatPolicy):
    """``ChatPolicy`` over a ``vllm.LLM`` engine (built from ``model`` unless ``engine`` is given)."""

    def __init__(
        self,
        model: str,
        sampling: SamplingConfig = SamplingConfig(),
        prompt: PromptConfig = PromptConfig(),
        name: str = "vllm",
        engine: Any = None,
        **engine_args: Any,
    ):
        from vllm import LLM

        self.engine = engine or LLM(model=model, logprobs_mode="processed_logprobs", **engine_args)
        super().__init__(self.engine.get_tokenizer(), sampling, prompt, name)

    def sampling_params(self) -> Any:
        from vllm import SamplingParams

        s = self.sampling
        greedy = s.temperature <= 0
        return SamplingParams(
            temperature=0.0 if greedy else s.temperature,
            top_p=1.0 if greedy else s.top_p,
            max_tokens=s.max_new_tokens,
            logprobs=0,
        )

    def generate(self, prompts: list[list[int]]) -> list[Action]:
        from vllm.inputs import TokensPrompt

        outputs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], self.sampling_params(),
                                       use_tqdm=False)
        actions = []
        for prompt, output in zip(prompts, outputs):
            sample = output.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], ids)]
            text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
            actions.append(Action(text, ids, logprobs or None, list(prompt)))
        return actions
