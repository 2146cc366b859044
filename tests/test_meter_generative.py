"""The generative meter (§3.1, D.2, E.4): greedy answers read strictly, the +logit readout, SFT and GRPO with TRL.

Real models only: tiny randomly initialised Llamas over a byte-level BPE trained here, offline, on the meter's own
prompts and answers (so that ``Ġtrue`` / ``Ġfalse`` are single tokens, as in SmolLM2 or Qwen), and the offline
SmolLM2 in one slow test.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from deltattg.data.trajectory import MeterOutput, Trajectory, state_prefixes
from deltattg.hf import common_prefix_length
from deltattg.meter.answer import LOGIT_PREFIX, format_answer, parse_answer
from deltattg.meter.base import CachedMeter, Meter
from deltattg.meter.generative import (
    CONFIG_NAME,
    GenerativeMeter,
    history_tokens,
    logit_readout_ids,
    read_meter_config,
)
from deltattg.meter.prompt import PROMPT_VERSION, meter_messages, render_prompt
from deltattg.meter.shared_prefix import SDPA_SHARING_KV_HEADS, Row, SharedPrefixDecoder, plan_bases
from deltattg.meter.train_generative import (
    grpo_config,
    meter_dataset,
    progress_reward,
    progress_rewards,
    sft_config,
    sft_trainer,
    token_score,
    train_grpo,
    train_sft,
    trajectory_records,
)
from conftest import needs_smollm2

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
BUDGET = 400  # max_prompt_tokens of the tiny meters (their context is 512)
ANSWER_TOKENS = 24


def history(task: str, *turns: tuple[str, str]) -> list[dict]:
    messages = [{"role": "user", "content": task}]
    for action, observation in turns:
        messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": observation}]
    return messages


EXAMPLES = [  # (decision prefix, b, v)
    (history("put a mug in the cabinet"), True, 120),
    (history("put a mug in the cabinet", ("go to the table", "you see a mug")), True, 80),
    (history("put a mug in the cabinet", ("go to the door", "the door is locked")), False, None),
    (history("find the red key"), True, 35),
    (history("find the red key", ("open the drawer", "it is empty")), False, None),
    (history("find the red key", ("look under the bed", "you see a red key")), True, 7),
]
HISTORIES = [h for h, _, _ in EXAMPLES]
TARGETS = [MeterOutput(can_complete=b, tokens_to_go=v) for _, b, v in EXAMPLES]


def bpe_tokenizer(vocab_size: int = 1000):
    """A byte-level BPE with a ChatML template, trained offline on the meter prompts and answers of EXAMPLES."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [meter_messages(h)[0]["content"] for h in HISTORIES]
    corpus += [format_answer(True, n) for n in range(0, 1000, 7)] + [format_answer(False, None)] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>", additional_special_tokens=SPECIALS[1:]
    )
    fast.chat_template = CHATML
    return fast


def tiny_meter(seed: int = 0, **settings) -> GenerativeMeter:
    """A random h64 × 2-layer Llama meter (~0.2 M parameters) over :func:`bpe_tokenizer`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = bpe_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    settings = {"max_prompt_tokens": BUDGET, "max_new_tokens": ANSWER_TOKENS, **settings}
    return GenerativeMeter(LlamaForCausalLM(config), tokenizer, **settings)


def dataset(meter: GenerativeMeter):
    records = [{"messages": h, "can_complete": b, "tokens_to_go": v} for h, b, v in EXAMPLES]
    return meter_dataset(records, meter.tokenizer, meter.max_prompt_tokens)


def fast_args(**overrides) -> dict:
    """Trainer settings for seconds-long runs (on CPU even where a GPU exists: tiny models are faster there)."""
    base = {"use_cpu": True, "gradient_checkpointing": False, "disable_tqdm": True, "seed": 0, "logging_steps": 10}
    return {**base, **overrides}


def parameters(meter: GenerativeMeter) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in meter.model.named_parameters()}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """One SFT run on EXAMPLES (100 steps at lr 5e-3: a tiny model needs far more than the paper's 1e-5 × 1 epoch)."""
    meter = tiny_meter()
    before = {"readings": meter.score(HISTORIES), "meter_id": meter.meter_id, "nll": answer_nll(meter)}
    out = tmp_path_factory.mktemp("sft")
    args = sft_config(
        out, **fast_args(learning_rate=5e-3, max_steps=100, per_device_train_batch_size=6, save_strategy="no",
                         lr_scheduler_type="constant")
    )
    trained = train_sft(meter, dataset(meter), out, args=args)
    return {"meter": trained, "dir": out, **before}


def answer_nll(meter: GenerativeMeter) -> float:
    """Mean per-token negative log-likelihood of the target answers of EXAMPLES after their meter prompts."""
    total = 0.0
    for prompt, target in zip(meter.prompts(HISTORIES), TARGETS):
        prompt_ids = meter.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = meter.tokenizer(format_answer(target.can_complete, target.tokens_to_go),
                                     add_special_tokens=False)["input_ids"]  # fmt: skip
        with torch.no_grad():
            logits = meter.model(torch.tensor([prompt_ids + answer_ids])).logits[0, len(prompt_ids) - 1 : -1]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(answer_ids)[:, None])
        total -= logp.mean().item()
    return total / len(TARGETS)


# ---- the GRPO reward (our reconstruction) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "b", "v", "reward"),
    [
        ("garbage", True, 100, 0.0),
        ("garbage", False, None, 0.0),
        ('{"can_complete": true, "tokens_to_go": 12.0}', True, 12, 0.0),  # strict: no floats
        ('{"tokens_to_go": 12, "can_complete": true}', True, 12, 0.0),  # strict: key order
        (format_answer(False, None), False, None, 1.0),
        (format_answer(True, 5), False, None, 0.0),
        (format_answer(False, None), True, 100, 0.0),
        (format_answer(True, 100), True, 100, 1.0),
        (format_answer(True, 0), True, 0, 1.0),
        (format_answer(True, 49), True, 99, 0.75),  # s = 50 / 100
        (format_answer(True, 199), True, 99, 0.75),  # s = 100 / 200: over- and under-estimates alike
        (format_answer(True, 0), True, 3, 0.625),  # s = 1 / 4
        ('  {"can_complete": true, "tokens_to_go": 3}\n', True, 3, 1.0),  # JSON whitespace is fine
    ],
)
def test_progress_reward_by_hand(text, b, v, reward):
    assert progress_reward(text, b, v) == pytest.approx(reward)


def test_token_score_and_reward_bounds():
    assert token_score(3, 3) == 1.0
    assert token_score(0, 9) == token_score(9, 0) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        progress_reward(format_answer(True, 3), True, None)


def test_progress_rewards_takes_trl_reward_function_arguments():
    """TRL calls reward functions with prompts, completions, completion_ids and every dataset column as keywords;
    conversational datasets give each completion as a list holding one assistant message."""
    completions = [
        [{"role": "assistant", "content": format_answer(True, 9)}],
        [{"role": "assistant", "content": "not json"}],
        format_answer(False, None),
    ]
    rewards = progress_rewards(
        prompts=[[{"role": "user", "content": "x"}]] * 3,
        completions=completions,
        completion_ids=[[1], [2], [3]],
        can_complete=[True, True, False],
        tokens_to_go=[9, 9, None],
        trainer_state=None,
    )
    assert rewards == [1.0, 0.0, 1.0]


def test_sft_loss_covers_the_answer_tokens_only(tmp_path):
    """D.2: prompt tokens are masked; the loss reads the answer y of Eq. 3 and the end of turn that stops it. The
    prompt TRL trains on is token for token the one the meter reads."""
    meter = tiny_meter()
    trainer = sft_trainer(meter, dataset(meter), sft_config(tmp_path, **fast_args()))
    prompts = meter.tokenizer(meter.prompts(HISTORIES), add_special_tokens=False)["input_ids"]
    for row, prompt, (_, b, v) in zip(trainer.train_dataset, prompts, EXAMPLES, strict=True):
        trained = [i for i, label in enumerate(row["labels"]) if label != -100]  # TRL folds the mask into labels
        start = len(prompt)
        assert row["input_ids"][:start] == prompt and trained == list(range(start, len(row["input_ids"])))
        assert meter.tokenizer.decode(row["input_ids"][start:]) == format_answer(b, v) + "<|im_end|>\n"


def test_grpo_config_matches_paper_defaults(tmp_path):
    args = grpo_config(tmp_path, max_completion_length=ANSWER_TOKENS)
    assert (args.learning_rate, args.num_generations, args.scale_rewards) == (3e-6, 8, "group")
    assert args.max_completion_length == ANSWER_TOKENS
    sft_args = sft_config(tmp_path)
    assert (sft_args.learning_rate, sft_args.num_train_epochs) == (1e-5, 1)
    assert sft_args.completion_only_loss and sft_args.max_length is None


# ---- the E.4 logit readout ------------------------------------------------------------------------------------------


def test_logit_readout_compares_the_first_distinct_tokens():
    """Whether the tokenizer writes the space into the word (byte-level BPE: Ġtrue / Ġfalse) or on its own
    (a character-level BPE), the readout compares the first tokens at which the two answers differ."""
    prompt = "<|im_start|>assistant\n"
    bpe = bpe_tokenizer()
    context, yes, no = logit_readout_ids(bpe, prompt)
    assert bpe.convert_ids_to_tokens([yes, no]) == ["Ġtrue", "Ġfalse"]
    assert bpe.decode(context) == prompt + LOGIT_PREFIX

    chars = bpe_tokenizer(vocab_size=len(SPECIALS) + 256)  # no merges: one token per byte, the space on its own
    context, yes, no = logit_readout_ids(chars, prompt)
    assert chars.decode([yes, no]) == "tf"
    assert chars.decode(context) == prompt + LOGIT_PREFIX + " "


def test_logit_equals_a_hand_forward_pass():
    """Batched (left-padded, histories of different lengths) readout = one unpadded forward pass per prompt."""
    meter = tiny_meter()
    true_id, false_id = meter.tokenizer.convert_tokens_to_ids(["Ġtrue", "Ġfalse"])
    expected = []
    for h in HISTORIES:
        prompt = render_prompt(meter_messages(h, meter.tokenizer, BUDGET), meter.tokenizer) + LOGIT_PREFIX
        ids = torch.tensor([meter.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(meter.model(input_ids=ids).logits[0, -1], dim=-1)
        expected.append(float(logp[true_id] - logp[false_id]))
    assert meter.logits(HISTORIES) == pytest.approx(expected, abs=1e-4)
    assert len({round(z, 6) for z in expected}) > 1  # the prompts really differ


# ---- a random meter: deterministic, and invalid ---------------------------------------------------------------------


def test_random_model_is_deterministic_and_its_answers_are_invalid():
    meter = tiny_meter()
    assert isinstance(meter, Meter)
    texts = meter.generate(HISTORIES)
    assert texts == meter.generate(HISTORIES)  # greedy
    assert all(texts) and all(parse_answer(t) is None for t in texts)
    assert meter.score(HISTORIES) == [None] * len(HISTORIES)
    assert meter.score([]) == meter.logits([]) == []
    both = tiny_meter(readout="both")
    assert both.score(HISTORIES) == [None] * len(HISTORIES)  # no valid answer, so no reading to attach z to
    assert both.meter_id != meter.meter_id


def test_meter_id_names_weights_budget_and_readout():
    meter = tiny_meter()
    assert meter.meter_id == tiny_meter().meter_id
    assert meter.meter_id != tiny_meter(seed=1).meter_id
    assert meter.meter_id != tiny_meter(max_prompt_tokens=BUDGET - 1).meter_id
    first = meter.meter_id
    with torch.no_grad():
        next(meter.model.parameters()).add_(1e-3)  # an in-place update is noticed
    assert meter.meter_id != first
    with pytest.raises(ValueError):
        tiny_meter(max_prompt_tokens=10)  # cannot hold the instruction


# ---- SFT, then reading, saving and loading the trained meter --------------------------------------------------------


def test_sft_teaches_the_answers(sft):
    """Before SFT no answer parses; after it the target answers are far likelier and every answer parses. (Whether
    every number comes out exactly is left to the CPU's rounding: one CPU read 80 where another read 7.)"""
    assert sum(r is not None for r in sft["readings"]) == 0
    trained = sft["meter"]
    assert answer_nll(trained) < 0.1 * sft["nll"]
    assert all(r is not None for r in trained.score(HISTORIES))
    assert trained.meter_id != sft["meter_id"]


def test_batched_readings_equal_one_at_a_time(sft):
    trained = sft["meter"]
    assert [trained.score([h])[0] for h in HISTORIES] == trained.score(HISTORIES)
    assert [trained.logits([h])[0] for h in HISTORIES] == pytest.approx(trained.logits(HISTORIES), abs=1e-4)


def test_readouts_and_cached_meter(sft, tmp_path):
    trained = sft["meter"]
    answers = trained.score(HISTORIES)  # whatever the trained meter answers, each readout must agree with it
    z = trained.logits(HISTORIES)
    assert [zi > 0 for zi in z] == [a.can_complete for a in answers]  # the trained meter's z agrees with its answers
    both = GenerativeMeter.from_pretrained(str(sft["dir"]), readout="both")
    assert both.score(HISTORIES) == [MeterOutput(a.can_complete, a.tokens_to_go, logit=pytest.approx(zi, abs=1e-4),
                                                 probability=pytest.approx(1 / (1 + math.exp(-zi)), abs=1e-4))
                                     for a, zi in zip(answers, z)]  # fmt: skip
    only = GenerativeMeter.from_pretrained(str(sft["dir"]), readout="logit")
    assert [r.logit for r in only.score(HISTORIES)] == pytest.approx(z, abs=1e-4)
    assert all(r.can_complete is None for r in only.score(HISTORIES))
    cached = CachedMeter(trained)
    assert cached.score(HISTORIES + HISTORIES[:2]) == answers + answers[:2]
    assert cached.stats.scored == len(HISTORIES)


def test_save_and_load_give_the_same_readings(sft):
    trained = sft["meter"]
    config = json.loads((sft["dir"] / CONFIG_NAME).read_text())
    assert config["kind"] == "generative" and config["max_prompt_tokens"] == BUDGET
    assert config["max_new_tokens"] == ANSWER_TOKENS
    loaded = GenerativeMeter.from_pretrained(str(sft["dir"]))
    assert loaded.score(HISTORIES) == trained.score(HISTORIES)
    assert loaded.logits(HISTORIES) == pytest.approx(trained.logits(HISTORIES), abs=1e-5)
    assert loaded.meter_id.split(":")[2] == trained.meter_id.split(":")[2]  # same weights, prompt and budgets
    assert GenerativeMeter.from_pretrained(str(sft["dir"]), max_prompt_tokens=BUDGET - 8).meter_id != loaded.meter_id


@pytest.mark.parametrize("change", [{"kind": "regression"}, {"prompt_version": PROMPT_VERSION + 1}])
def test_meter_config_refuses_other_kinds_and_prompt_versions(tmp_path, change):
    config = {"kind": "generative", "prompt_version": PROMPT_VERSION, "max_prompt_tokens": BUDGET}
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    assert read_meter_config(tmp_path) == {"max_prompt_tokens": BUDGET}
    (tmp_path / CONFIG_NAME).write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError):
        read_meter_config(tmp_path)


def test_grpo_two_steps_change_the_weights(sft, tmp_path):
    meter = GenerativeMeter.from_pretrained(str(sft["dir"]))
    before = parameters(meter)
    args = grpo_config(
        tmp_path, max_completion_length=ANSWER_TOKENS,
        **fast_args(max_steps=2, per_device_train_batch_size=8, learning_rate=1e-3, save_strategy="no",
                    temperature=2.0),
    )

    def length(completions, **_):  # differs within every group at T = 2, whatever the meter samples
        return [float(len(str(c))) for c in completions]

    # The trained meter is sure of itself: at T = 1 a group may hold one answer eight times, and any reward of it
    # gives zero advantages; at T = 2 its answers rarely parse, so the progress reward would be 0 for all.
    refined = train_grpo(meter, dataset(meter), tmp_path, args=args, reward_funcs=length)
    after = parameters(refined)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert (tmp_path / CONFIG_NAME).is_file()
    assert refined.meter_id != sft["meter"].meter_id


# ---- resumable SFT, LoRA, data ---------------------------------------------------------------------------------------


def test_sft_resumes_from_its_checkpoint(tmp_path):
    data = dataset(tiny_meter())
    args = fast_args(learning_rate=1e-3, per_device_train_batch_size=6, save_steps=1)
    train_sft(tiny_meter(), data, tmp_path, args=sft_config(tmp_path, max_steps=2, **args))
    assert (tmp_path / "checkpoint-2").is_dir()
    train_sft(tiny_meter(), data, tmp_path, args=sft_config(tmp_path, max_steps=3, **args), resume_from_checkpoint=True)
    state = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3


def test_lora_sft_is_merged_into_a_plain_checkpoint(tmp_path):
    from peft import LoraConfig

    meter = tiny_meter()
    before = parameters(meter)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = sft_config(tmp_path, **fast_args(learning_rate=1e-2, max_steps=2, per_device_train_batch_size=6,
                                            save_strategy="no"))
    trained = train_sft(meter, dataset(meter), tmp_path, args=args, peft_config=lora)
    after = parameters(trained)
    assert set(after) == set(before)  # no adapter weights left
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("q_proj" in name or "v_proj" in name for name in changed)
    assert GenerativeMeter.from_pretrained(str(tmp_path)).meter_id.split(":")[2] == trained.meter_id.split(":")[2]


def test_meter_dataset_from_trajectories():
    messages = HISTORIES[1] + [{"role": "assistant", "content": "open the cabinet"}]
    trajectories = [
        Trajectory(id="a", group="g", reward=1.0, success=True, messages=messages, step_tokens=[5, 9]),
        Trajectory(id="b", group="g", reward=0.0, success=False, messages=messages, step_tokens=[5, 9]),
    ]
    meter = tiny_meter()
    data = meter_dataset(trajectory_records(trajectories), meter.tokenizer, BUDGET)
    assert data["can_complete"] == [True, True, False, False]
    assert data["tokens_to_go"] == [14, 9, None, None]  # Eq. 1-2
    assert [c[0]["content"] for c in data["completion"]] == [
        format_answer(True, 14), format_answer(True, 9), format_answer(False, None), format_answer(False, None)
    ]
    assert data["prompt"][1] == meter_messages(messages[:3], meter.tokenizer, BUDGET)


# ---- every state of a trajectory on one shared key/value cache ------------------------------------------------------

TRAJECTORIES = [  # of different lengths; their states include the EXAMPLES the sft fixture learned
    history("put a mug in the cabinet", ("go to the table", "you see a mug")),
    history("find the red key", ("open the drawer", "it is empty"), ("look under the bed", "you see a red key")),
    history("find the red key"),  # no action: only its final state h_0
]


def test_plan_bases_by_hand():
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], [1, 9, 9, 9, 9, 9], [1, 9, 9, 9, 9, 9, 7]]
    assert plan_bases(prompts, [2, 4, 5, 5, 6]) == [(2, [0, 1, 2]), (4, [3, 4])]  # prompt 2 shares 1 id with 4
    assert plan_bases(prompts, [1, 1, 1, 1, 6]) == [(4, [0, 1, 2, 3, 4])]
    assert plan_bases([], []) == []


def test_shared_prefix_decoder_equals_generate_with_drafts_kept_as_far_as_greedy_agrees():
    """Five prompts branching off one base at different points (one equal to a prefix of it); drafts that greedy
    accepts whole, in part and not at all: every answer equals ``generate``'s own greedy answer."""
    from deltattg.tiny import byte_tokenizer, tiny_llama

    tokenizer = byte_tokenizer()
    model = tiny_llama(tokenizer, hidden=64, layers=2, heads=4, seed=1)
    with torch.no_grad():  # sharper logits: answers that depend on the prompt, not one repeated token
        for p in model.parameters():
            p.mul_(4.0)
    rng = torch.Generator().manual_seed(0)
    base = torch.randint(3, 200, (120,), generator=rng).tolist()
    prompts = [base[:k] + torch.randint(3, 200, (n,), generator=rng).tolist()
               for k, n in [(10, 3), (40, 1), (41, 7), (80, 0), (119, 2)]]  # fmt: skip
    stop = [tokenizer.eos_token_id]
    expected = [model.generate(torch.tensor([p]), max_new_tokens=9, do_sample=False, eos_token_id=stop,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]  # fmt: skip
    assert len({tuple(e) for e in expected}) == len(prompts)
    drafts = [expected[0][:4], expected[1][:2] + [5], [5, 6], [], expected[4][:1]]
    decoder = SharedPrefixDecoder(model.eval(), max_new_tokens=9, stop_ids=stop)
    rows = [Row(min(common_prefix_length(p, base), len(p) - 1), [], d) for p, d in zip(prompts, drafts)]
    for row, p in zip(rows, prompts):
        row.pending = p[row.cached :]
    decoder.prefill(base[: max(row.cached for row in rows)])
    decoder.answer(rows)
    assert [row.answer for row in rows] == expected
    assert decoder.stats.prefilled == 119 + sum(len(row.pending) for row in rows)
    assert decoder.cache.get_seq_length() == 119  # the answers' tokens are gone again
    assert decoder.stats.decoded == sum(9 - min(common_prefix_length(e, d), 8) - 1 for e, d in zip(expected, drafts))


def test_decoder_reads_grouped_key_value_heads_as_they_are_and_gives_the_model_back():
    """Inside the decoder a model on SDPA attention (4 query heads over 2 key/value heads) runs
    ``sdpa_sharing_kv_heads``: under a tree-shaped 4-D mask its logits equal transformers' SDPA (which repeats the
    heads); on leaving, even by an error, the model is on SDPA again; a model on eager attention is left alone."""
    model = tiny_meter().model.eval()
    ids = torch.randint(3, 60, (1, 12), generator=torch.Generator().manual_seed(0))
    tree = torch.tril(torch.ones(12, 12, dtype=torch.bool))
    tree[6:, 3:6] = False  # the last six tokens branch off after the third
    mask = torch.zeros(12, 12).masked_fill(~tree, torch.finfo(torch.float32).min)[None, None]
    positions = torch.tensor([[*range(6), *range(3, 9)]])
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        with SharedPrefixDecoder(model, max_new_tokens=1, stop_ids=[]):
            assert model.config._attn_implementation == SDPA_SHARING_KV_HEADS
            ours = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(KeyError), SharedPrefixDecoder(model, max_new_tokens=1, stop_ids=[]):
        raise KeyError("a reading failed")
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")
    with SharedPrefixDecoder(model, max_new_tokens=1, stop_ids=[]):
        assert model.config._attn_implementation == "eager"


def test_shared_prefix_readings_equal_per_prefix(sft):
    """``score_trajectories`` (one cache per trajectory) gives every state the reading ``score`` gives it alone:
    the same answers and the same E.4 logit, reading far fewer prompt tokens."""
    trained = sft["meter"]
    both = GenerativeMeter(trained.model, trained.tokenizer, max_prompt_tokens=BUDGET, max_new_tokens=ANSWER_TOKENS,
                           readout="both")  # fmt: skip
    states = [state_prefixes(t, terminal=True) for t in TRAJECTORIES]
    shared = both.score_trajectories(TRAJECTORIES)
    alone = [both.score(s) for s in states]
    assert [len(row) for row in shared] == [2, 3, 1]
    assert sum(r is not None for row in shared for r in row) >= 4  # the learned EXAMPLES parse
    for ours, theirs in zip(shared, alone):
        assert [(r.can_complete, r.tokens_to_go) if r else None for r in ours] == \
            [(r.can_complete, r.tokens_to_go) if r else None for r in theirs]
        assert [r.logit for r in ours if r] == pytest.approx([r.logit for r in theirs if r], abs=1e-4)
    assert both.generate_trajectories(TRAJECTORIES) == [both.generate(s) for s in states]
    prompt_tokens = sum(len(ids) for s in states for ids in trained.tokenizer(both.prompts(s))["input_ids"])
    assert both.prefix_stats.prefilled < 0.6 * prompt_tokens


def test_shared_prefix_restarts_where_the_window_drops_turns(sft):
    """With a budget that holds the task and two turns, the later states' prompts drop old turns: they start bases
    of their own, and every state still reads what its own prompt says."""
    trained = sft["meter"]
    long = history("find the red key", *[(f"open drawer {k}", f"drawer {k} is empty") for k in range(1, 7)])
    logit = GenerativeMeter(trained.model, trained.tokenizer, max_prompt_tokens=260, max_new_tokens=ANSWER_TOKENS,
                            readout="logit")  # fmt: skip
    states = state_prefixes(long, terminal=True)
    prompts = logit.prompts(states)
    assert "earlier turn" in prompts[-1] and "earlier turn" not in prompts[0]
    ids = trained.tokenizer(prompts, add_special_tokens=False)["input_ids"]
    assert len(plan_bases(ids, [history_tokens(trained.tokenizer, p) for p in prompts])) > 1
    (shared,) = logit.score_trajectories([long])
    assert [r.logit for r in shared] == pytest.approx(logit.logits(states), abs=1e-4)
    assert logit.generate_trajectories([long]) == [logit.generate(states)]


def test_cached_trajectory_meter_reads_a_trajectory_once_and_contains_failures(sft, tmp_path):
    from deltattg.meter.base import CachedTrajectoryMeter
    from deltattg.meter.cache import ScoreCache

    trained = sft["meter"]
    expected = trained.score_trajectories(TRAJECTORIES)
    with ScoreCache(tmp_path / "c.sqlite") as cache:
        cached = CachedTrajectoryMeter(trained, cache, cache_invalid=True)
        assert cached.score_trajectories(TRAJECTORIES + TRAJECTORIES[:1]) == expected + expected[:1]
        assert cached.stats.scored == 6  # 2 + 3 + 1 states, the repeated trajectory read once
        again = CachedTrajectoryMeter(trained, cache, cache_invalid=True)
        assert again.score_trajectories(TRAJECTORIES) == expected and again.stats.scored == 0

    class Broken:
        meter_id = "broken"

        def score_trajectories(self, trajectories):
            raise RuntimeError("out of memory")

    broken = CachedTrajectoryMeter(Broken())  # type: ignore[arg-type]
    assert broken.score_trajectories(TRAJECTORIES[:2]) == [[None, None], [None, None, None]]
    assert broken.stats.backend_errors == 1 and broken.stats.invalid == 5


def test_score_reads_the_same_on_a_shared_prefix_as_per_prefix(sft, tmp_path):
    """``deltattg score --meter GEN`` (shared prefix, the default) and ``--per-prefix`` write the same readings."""
    from deltattg.cli import main

    src = tmp_path / "trajectories.jsonl"
    records = [{"id": f"t{k}", "group": "g", "reward": float(k % 2), "success": k % 2 == 1, "messages": t}
               for k, t in enumerate(TRAJECTORIES)]  # fmt: skip
    src.write_text("".join(json.dumps(record) + "\n" for record in records))
    written = []
    for flags in ([], ["--per-prefix"]):
        out = tmp_path / f"scored{len(flags)}.jsonl"
        assert main(["score", str(src), "--meter", str(sft["dir"]), "--out", str(out), "--no-progress", *flags]) == 0
        written.append([json.loads(line)["meter"] for line in out.read_text().splitlines()])
    assert [len(m) for m in written[0]] == [1, 2, 0]
    assert sum(r is not None for m in written[0] for r in m) == 3
    assert written[0] == written[1]


# ---- the real offline model ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_scores_real_prefixes(hotpotqa_path):
    from deltattg.data.sources import read_trajectories

    needs_smollm2()
    items, _ = read_trajectories(hotpotqa_path)
    prefixes = [p for item in items[:1] for p in item.trajectory.prefixes()][:2]
    meter = GenerativeMeter.from_pretrained("smollm2", max_prompt_tokens=512)
    readings = meter.score(prefixes)
    assert len(readings) == 2 and all(r is None or isinstance(r, MeterOutput) for r in readings)
    assert all(math.isfinite(z) for z in meter.logits(prefixes))
    assert meter.meter_id.startswith("generative:smollm2:")


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_smollm2_trains_as_a_generative_meter_and_reads_on_a_shared_prefix(tmp_path, lora):
    """The GGUF-loaded SmolLM2 fine-tunes (issue 23, item 0): its dequantised weights carry no quantizer mark, so
    transformers' Trainer and peft accept it. One SFT step and one GRPO step (LoRA merged in), then the saved meter
    reads a household trajectory's states on one shared cache exactly as prefix by prefix (a 256-token window, so
    old turns drop)."""
    from conftest import collect_household
    from deltattg.data.sources import read_trajectory_file
    from deltattg.meter.commands import train_generative

    needs_smollm2()
    pool = collect_household(tmp_path / "pool.jsonl", ["expert:0.3"], 2, "--max-turns", "6", "--tokenizer", "smollm2")
    items = read_trajectory_file(str(pool)).items
    out = tmp_path / "meter"
    settings = {"max_steps": 1, "per_device_train_batch_size": 2, "num_generations": 2, "use_cpu": True,
                "gradient_checkpointing": False, "disable_tqdm": True, "save_strategy": "no"}  # fmt: skip
    sft_only = {k: v for k, v in settings.items() if k != "num_generations"}
    train_generative(items[:1], "smollm2", str(out / "sft"), stage="sft", max_prompt_tokens=256, lora=lora,
                     train_settings=sft_only)  # fmt: skip
    train_generative(items[:1], str(out / "sft"), str(out / "grpo"), stage="grpo", max_prompt_tokens=256, lora=lora,
                     train_settings=settings)
    meter = GenerativeMeter.from_pretrained(str(out / "grpo"), readout="both", max_new_tokens=12)
    assert not getattr(meter.model, "is_quantized", False)
    messages = items[0].trajectory.messages
    states = state_prefixes(messages, terminal=True)
    assert meter.generate_trajectories([messages]) == [meter.generate(states)]
    (shared,) = meter.score_trajectories([messages])
    assert [r and r.logit for r in shared] == pytest.approx([r and r.logit for r in meter.score(states)], abs=1e-3)
