"""A judge served by a vLLM engine of its own (``judge.backend: vllm``), beside the policy's engine: the judge
folder is loaded as it is (no weights are ever pushed to it), token ids go in, and the verdict is read without
sampling text.

A probability read asks for one token restricted to the verdicts (``allowed_token_ids``) with their log-probs under
``processed_logprobs``: the engine masks every other token before its log-softmax, so it returns
log q_k = log p(v_k) − log Σ_j p(v_j), the verdicts' probabilities normalised over them — what the judge's
arithmetic reads (docs/algorithms.md §12: the expected score, the first slot's probability and the listings' shares
depend on q alone). Measured on vLLM 0.32's CPU build against the HF forward: within 1.1e-7 in float32. The mass
on the verdicts is not returned, so ``judge.min_verdict_mass`` is refused with this backend. A text read is greedy
decoding up to the judge's end-of-sequence tokens, decoded with the judge's tokenizer.

One judge engine per process, reused by the next judge on the same folder and settings; stopped at exit.
"""

from __future__ import annotations

import atexit
import json
from pathlib import Path

import torch

from tether.errors import ConfigError
from tether.models.judge import judge_stop_ids
from tether.models.lm import inductor_compiles_here, load_tokenizer
from tether.online_sections import VLLM_INSTALL
from tether.rollout.vllm_backend import kv_cache_bytes, vllm_version
from tether.rollout.vllm_engine import _check_main_guarded, _new_folder, _shutdown, _start_engine, _tell, _watch

_JUDGE_ENGINE: dict = {}  # {"key": what it was started with, "llm": the engine, "folder": an empty folder, ...}


def _stop_at_exit() -> None:
    _shutdown(_JUDGE_ENGINE)
    _JUDGE_ENGINE.clear()


class VLLMJudge:
    """The judge's reads on a vLLM engine: ``next_token_logprobs`` (normalised over the targets) and ``generate``."""

    normalised = True  # log-probs come normalised over the verdicts: no verdict mass

    def __init__(self, path: str | Path, dtype: str = "float32", batch_size: int = 16, gpu_share: float = 0.2):
        import multiprocessing

        if vllm_version() is None:
            raise ConfigError(VLLM_INSTALL.replace("--rollout-backend vllm", "--judge-backend vllm"))
        self.path = Path(path)
        self.tokenizer = load_tokenizer(path)
        config = json.loads((self.path / "config.json").read_text())
        self.context = config.get("max_position_embeddings") or 2048
        served = "float32" if dtype == "float64" else dtype  # vLLM has no float64 kernels
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(str(self.path))
        key = {
            "model": str(self.path.resolve()),
            "config": json.dumps(config, sort_keys=True),
            "dtype": served,
            "context": self.context,
            "kv_bytes": kv_cache_bytes(model_config, batch_size, self.context, getattr(torch, served), 0),
            "sleep": False,
            "gpu_share": gpu_share,
            "compiled": inductor_compiles_here(),
            "vision": False,  # a text judge: token ids in and out, no tokenizer in the engine
        }
        if _JUDGE_ENGINE.get("key") != key:
            from tether.console import loading

            loading(f"the judge's vLLM engine on {self.path} (its start takes tens of seconds)")
            _shutdown(_JUDGE_ENGINE)
            _JUDGE_ENGINE.clear()
            _check_main_guarded()
            # the watchdog stops the engine's processes should the trainer die; its folder is an empty one of its
            # own (the watchdog removes it), never the judge's
            folder = _new_folder()
            engine = {"folder": folder, "watchdog": _watch(folder)}
            before = {p.pid for p in multiprocessing.active_children()}
            try:
                engine["llm"] = _start_engine(self.path, key)
            except BaseException:
                _shutdown(engine)
                raise
            _tell(engine["watchdog"], [p.pid for p in multiprocessing.active_children() if p.pid not in before])
            _JUDGE_ENGINE.update(engine, key=key)
            atexit.unregister(_stop_at_exit)
            atexit.register(_stop_at_exit)
        self.llm = _JUDGE_ENGINE["llm"]
        self.stop_ids = judge_stop_ids(self.tokenizer)

    def describe(self) -> str:
        return f"vLLM {vllm_version()} engine of its own (verdicts normalised by the engine)"

    def next_token_logprobs(self, ids: list[list[int]], targets: list[int]) -> torch.Tensor:
        """(N, K) float32: log q_k, the targets' log-probs normalised over the targets, after each prompt."""
        from vllm import SamplingParams

        if not ids:
            return torch.zeros(0, len(targets))
        params = SamplingParams(
            max_tokens=1,
            temperature=1.0,
            allowed_token_ids=list(targets),
            logprobs=len(targets),
            detokenize=False,
            seed=0,  # the one token drawn is never read
        )
        outputs = self.llm.generate([{"prompt_token_ids": list(row)} for row in ids], params, use_tqdm=False)
        out = torch.empty(len(ids), len(targets))
        for i, o in enumerate(outputs):
            step = o.outputs[0].logprobs[0]
            missing = [t for t in targets if t not in step]
            if missing:
                raise RuntimeError(
                    f"vLLM returned no log-prob for verdict token(s) {missing} (asked for {len(targets)} with "
                    f"allowed_token_ids): the judge engine's behaviour changed; read with --judge-backend hf"
                )
            out[i] = torch.tensor([step[t].logprob for t in targets])
        return out

    def generate(self, ids: list[list[int]], max_new_tokens: int) -> tuple[list[str], int]:
        """(greedy answers after each prompt, to the judge's end of sequence, special tokens dropped; the tokens
        written)."""
        from vllm import SamplingParams

        if not ids:
            return [], 0
        params = SamplingParams(
            max_tokens=max_new_tokens, temperature=0.0, stop_token_ids=self.stop_ids, detokenize=False
        )
        outputs = self.llm.generate([{"prompt_token_ids": list(row)} for row in ids], params, use_tqdm=False)
        written = [list(o.outputs[0].token_ids) for o in outputs]
        return self.tokenizer.batch_decode(written, skip_special_tokens=True), sum(map(len, written))
