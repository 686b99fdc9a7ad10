"""`tether bench`: where a training step's time goes on this machine, against the machine's own matmul peak.

    tether bench                                  # the lab's model and a 29 M-parameter Llama, fp32 and bf16
    tether bench --models 29m --precisions fp32 --json bench.json

1. **Peak.** The best of several square matmuls (``--matmul-size``) in fp32 and in bf16: GFLOP/s this process can
   reach with the threads it has. Every figure below is a share of it.
2. **Phases** of the steps every stage is made of, on a random Llama of the chosen size (random token ids; no
   tokenizer, no data):
   - ``forward`` and ``backward`` of a training batch (B × T tokens), FLOPs 2·N·tokens and 4·N·tokens, N the
     non-embedding parameters plus the output projection (the matmul work per token), plus attention's
     2·2·T²·H per layer and row (forward; twice that backward);
   - ``logprob_forward``: the same forward without gradients (a reference or old-policy pass);
   - ``generate``: ``--new-tokens`` sampled tokens for B prompts with the KV cache, FLOPs 2·N per token;
   - ``decode_step``: one of those tokens' forward alone (B rows, one position, the prompt's KV cache): what the
     model costs per generated token; the rest of generate's time per token is the loop around it (sampling,
     stopping criteria, cache bookkeeping), printed as ``generate overhead``;
   - ``optimizer``: one AdamW update with each implementation torch offers here (for-loop, foreach, fused);
   - with ``--compile``: forward + backward eager and under ``torch.compile``, the compilation's first call, and
     the steps it takes to pay it back.
   Each phase: median seconds of ``--repeats`` timed runs after one warm-up, GFLOP/s, and share of the peak.
3. **Padding** (``--data FILE --model DIR``): real tokens against padded positions when a file's examples are
   collated in batches of ``--batch`` (file order), i.e. the share of a step's positions that is wasted work: with
   padded rows, and with the padding-free micro-batches the offline stages use by default (tether/models/packing.py).

Times are machine-dependent: compare rows within one run. A JSON with every figure goes to ``--json``.
The figures and how to read them: docs/performance.md.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

SIZES = {  # name -> (hidden, layers, heads, vocab): the lab's pretrained model, and the 29 M model
    "lab": (128, 2, 4, 1024),
    "29m": (512, 6, 8, 8192),
}
PRECISIONS = ("fp32", "bf16")


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, kernels picked
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak(dtype: str, size: int = 1024, repeats: int = 10) -> float:
    """GFLOP/s of the best of ``repeats`` size×size matmuls (2·size³ FLOPs each)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(size, size).to(torch_dtype)
    b = torch.randn(size, size).to(torch_dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def cpu_bf16_flags() -> list[str]:
    """The CPU's bf16 instruction sets (avx512_bf16, amx_bf16) from /proc/cpuinfo; [] where bf16 is emulated."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(f for f in flags if "bf16" in f)


@dataclass
class Phase:
    name: str
    seconds: float
    flops: float

    def row(self, peak: float) -> dict:
        gflops = self.flops / self.seconds / 1e9 if self.seconds > 0 and self.flops else 0.0
        return {
            "phase": self.name,
            "seconds": self.seconds,
            "gflop": self.flops / 1e9,
            "gflops_per_s": gflops,
            "share_of_peak": gflops / peak if peak else 0.0,
        }


def build_model(size: str, precision: str, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM

    from tether.models.lm import tiny_config

    hidden, layers, heads, vocab = SIZES[size]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        tiny_config(
            "llama", vocab, hidden=hidden, layers=layers, heads=heads, max_positions=1024, bos_id=0, eos_id=1, pad_id=2
        )
    )
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    return model


def matmul_parameters(model) -> int:
    """Parameters a token's forward multiplies by: every weight matrix but the input embedding (a lookup); the
    output projection counts even when it is tied to the embedding."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters() if p.dim() >= 2 and p is not embedding)
    return total + (head.numel() if head is embedding else 0)


def phases(model, batch: int, length: int, new_tokens: int, repeats: int, compile_model: bool = False) -> list[Phase]:
    import torch

    cfg = model.config
    n = matmul_parameters(model)
    tokens = batch * length
    attention = (
        2 * 2 * length * length * cfg.hidden_size * cfg.num_hidden_layers * batch
    )  # QKᵀ and AV, causal not halved
    ids = torch.randint(3, cfg.vocab_size, (batch, length))
    model.train()
    out: list[Phase] = []

    def forward():
        return model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()

    out.append(Phase("forward", _timed(forward, repeats), 2 * n * tokens + attention))
    holder = {}

    def forward_backward():
        model.zero_grad(set_to_none=True)
        holder["loss"] = forward()
        holder["loss"].backward()

    both = _timed(forward_backward, repeats)
    out.append(Phase("backward", max(both - out[0].seconds, 1e-9), 4 * n * tokens + 2 * attention))
    if compile_model:
        out += compiled_phases(model, ids, both, 6 * n * tokens + 3 * attention, repeats)
    with torch.no_grad():
        out.append(Phase("logprob_forward", _timed(forward, repeats), 2 * n * tokens + attention))
    model.eval()
    prompt = ids[:, : max(1, length // 4)]
    generated = batch * new_tokens

    def generate():
        with torch.no_grad():
            model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                pad_token_id=2,
            )

    out.append(Phase("generate", _timed(generate, max(1, repeats // 2)), 2 * n * generated))
    with torch.no_grad():  # one decoding step alone: the model's share of a generated token's time
        from tether.rollout.decoding import cache_keyword

        keyword = cache_keyword(model)  # `cache` from transformers 5.20, `past_key_values` before
        cache = getattr(model(input_ids=prompt, use_cache=True), keyword)
        step_ids = prompt[:, -1:]
        out.append(
            Phase(
                "decode_step",
                _timed(lambda: model(input_ids=step_ids, use_cache=True, **{keyword: cache}), repeats),
                2 * n * batch,
            )
        )
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    for impl in ("for-loop", "foreach", "fused"):
        kwargs = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
        try:
            optimizer = torch.optim.AdamW(params, lr=1e-5, **kwargs)
        except (RuntimeError, TypeError) as err:  # an implementation this torch or device lacks
            out.append(Phase(f"optimizer ({impl}: {err})", 0.0, 0.0))
            continue
        out.append(Phase(f"optimizer ({impl})", _timed(optimizer.step, repeats), 0.0))
    return out


def compiled_phases(model, ids, eager_seconds: float, flops: float, repeats: int) -> list[Phase]:
    """torch.compile's forward + backward against eager's: the first call (compilation included), the steady
    step, and how many steps pay for the compilation."""
    import torch

    from tether.models.lm import inductor_compiles_here

    if not inductor_compiles_here():
        from tether.errors import ConfigError

        raise ConfigError(
            "--compile: torch inductor cannot compile on torch's scalar kernel path (ATEN_CPU_CAPABILITY=default) "
            "in this torch; unset ATEN_CPU_CAPABILITY or run the benchmark without --compile"
        )
    compiled = torch.compile(model)

    def step():
        model.zero_grad(set_to_none=True)
        compiled(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()

    t0 = time.perf_counter()
    try:
        step()
    except torch._dynamo.exc.BackendCompilerFailed as err:  # e.g. inductor's C++ under ATEN_CPU_CAPABILITY=default
        from tether.errors import ConfigError

        first_line = str(err).strip().splitlines()[0][:200]
        raise ConfigError(
            f"--compile: torch.compile could not compile the model on this machine ({first_line}); "
            "run the benchmark without --compile"
        ) from None
    first = time.perf_counter() - t0
    steady = _timed(step, repeats)
    saving = eager_seconds - steady
    steps = f"{(first - steady) / saving:.0f} steps to pay back" if saving > 0 else "never pays back"
    return [
        Phase("forward+backward (eager)", eager_seconds, flops),
        Phase("forward+backward (torch.compile)", steady, flops),
        Phase(f"compile, first call ({steps})", first, 0.0),
    ]


def padding_waste(data: str, model_dir: str, batch: int, max_length: int = 1024) -> dict:
    """Real tokens and padded positions of a file's examples, collated in file order in batches of ``batch``."""
    from tether.data.records import read_records
    from tether.data.sft import tokenize_records
    from tether.models.lm import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    examples, _ = tokenize_records(read_records(data), tokenizer, max_length, path=data)
    from tether.models.packing import choose_rows

    lengths = [len(e.input_ids) for e in examples]
    batches = [lengths[i : i + batch] for i in range(0, len(lengths), batch)]
    positions = sum(max(b) * len(b) for b in batches)
    packed = 0  # padding-free micro-batches (tether/models/packing.py): rows as long as the longest, fewer of them
    for b in batches:
        rows, _ = choose_rows(b, [list(range(len(b)))])
        packed += len(rows) * max(sum(b[i] for i in row) for row in rows)
    real = sum(lengths)
    return {
        "examples": len(lengths),
        "real_tokens": real,
        "positions": positions,
        "padding_share": 1 - real / positions if positions else 0.0,
        "padding_free_positions": packed,
        "padding_free_share": 1 - real / packed if packed else 0.0,
    }


def run_bench(
    models=("lab", "29m"),
    precisions=PRECISIONS,
    batch: int = 8,
    length: int = 256,
    new_tokens: int = 32,
    repeats: int = 5,
    matmul_size: int = 1024,
    data: str = "",
    model_dir: str = "",
    compile_model: bool = False,
) -> dict:
    import torch

    result = {
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_bf16": cpu_bf16_flags(),
        "peak_gflops": {},
        "runs": [],
    }
    for precision in precisions:
        result["peak_gflops"][precision] = matmul_peak(precision, matmul_size)
    for size in models:
        for precision in precisions:
            peak = result["peak_gflops"].get(precision)
            if peak is None:
                continue
            model = build_model(size, precision)
            rows = [p.row(peak) for p in phases(model, batch, length, new_tokens, repeats, compile_model)]
            run = {
                "model": size,
                "precision": precision,
                "parameters": sum(p.numel() for p in model.parameters()),
                "matmul_parameters": matmul_parameters(model),
                "batch": batch,
                "length": length,
                "new_tokens": new_tokens,
                "phases": rows,
            }
            run["generate_overhead"] = generate_overhead(run)
            result["runs"].append(run)
    if data:
        result["padding"] = padding_waste(data, model_dir, batch)
    return result


def generate_overhead(run: dict) -> dict | None:
    """Per generated token step: generate's time, the decode step's (the model), and the share of the loop around."""
    rows = {r["phase"]: r for r in run["phases"]}
    if "generate" not in rows or "decode_step" not in rows:
        return None
    per_token = rows["generate"]["seconds"] / run["new_tokens"]
    decode = rows["decode_step"]["seconds"]
    return {"per_token_s": per_token, "decode_step_s": decode, "loop_share": max(0.0, 1 - decode / per_token)}


def print_bench(result: dict) -> None:
    from tether.console import console

    peaks = ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in result["peak_gflops"].items())
    console.print(
        f"matmul peak ({result['threads']} threads, torch {result['torch']}, CPU bf16 instructions: "
        f"{', '.join(result['cpu_bf16']) or 'none (emulated)'}): {peaks}"
    )
    for run in result["runs"]:
        console.print(
            f"\n{run['model']} ({run['parameters'] / 1e6:.2f} M parameters, {run['matmul_parameters'] / 1e6:.2f} M "
            f"in matmuls), {run['precision']}, batch {run['batch']} x {run['length']} tokens, "
            f"generate {run['new_tokens']} tokens"
        )
        console.print(f"  {'phase':44s} {'seconds':>9s} {'GFLOP':>8s} {'GFLOP/s':>9s} {'of peak':>8s}")
        for row in run["phases"]:
            share = f"{row['share_of_peak']:.0%}" if row["gflop"] else ""
            gflops = f"{row['gflops_per_s']:.1f}" if row["gflop"] else ""
            console.print(f"  {row['phase']:44s} {row['seconds']:9.4f} {row['gflop']:8.2f} {gflops:>9s} {share:>8s}")
        overhead = generate_overhead(run)
        if overhead is not None:
            console.print(
                f"  generate: {overhead['per_token_s'] * 1e3:.2f} ms per token step, of which the model's "
                f"forward {overhead['decode_step_s'] * 1e3:.2f} ms; the loop around it "
                f"{overhead['loop_share']:.0%}"
            )
    if "padding" in result:
        p = result["padding"]
        console.print(
            f"\npadding: {p['examples']} examples, {p['real_tokens']} real tokens in {p['positions']} "
            f"positions: {p['padding_share']:.1%} of the positions are padding; padding-free "
            f"micro-batches: {p['padding_free_positions']} positions, {p['padding_free_share']:.1%} padding"
        )
