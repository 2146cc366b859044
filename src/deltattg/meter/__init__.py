"""The progress meter: answer format, prompt, score cache, the one ``Meter`` interface and its backends (§3.1).

Training the meter (SFT, GRPO, regression head) builds on the same prompt (:mod:`.prompt`) and answer (:mod:`.answer`).
"""

from deltattg.meter.answer import LOGIT_PREFIX, MAX_TOKENS_TO_GO, format_answer, parse_answer
from deltattg.meter.base import CachedMeter, Meter, ScoreStats
from deltattg.meter.cache import ScoreCache
from deltattg.meter.endpoint import EndpointMeter, EndpointStats
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages, prefix_hash, render_prompt

__all__ = [
    "LOGIT_PREFIX",
    "MAX_TOKENS_TO_GO",
    "PROMPT_VERSION",
    "CachedMeter",
    "EndpointMeter",
    "EndpointStats",
    "Meter",
    "ScoreCache",
    "ScoreStats",
    "format_answer",
    "meter_messages",
    "parse_answer",
    "prefix_hash",
    "render_prompt",
]
