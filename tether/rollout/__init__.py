"""Sampling responses and scoring their tokens: the rollout record (``batch``), prompt rendering and the one stop
set (``prompts``), the generation backends chosen by ``rollout.backend`` (``backends``; the KV-cache sampler the hf
backend runs in ``decoding``, the vLLM engine in ``vllm_backend`` — its start, failures and watchdog in
``vllm_engine``, its worker's AMX permission in ``vllm_worker``), a judge on a vLLM engine of its own
(``vllm_judge``), a rollout worker beside the trainer (``async_worker``: rollout.max_staleness; what crosses to it
in ``worker_wire``), the trainer's forward over a rollout (``forward``: log-probs at the sampling temperature,
entropies, critic states), and text generation and step offsets (``texts``).

May import: ``tether.algorithms``, ``tether.models``, ``tether.config``, ``tether.sections``,
``tether.online_sections``, ``tether.errors``, ``tether.console``, ``tether.processes``.
"""


def __getattr__(name: str):
    from tether._moved import moved_name  # tether.rollout.Rollout and the other names of 0.1's rollout.py

    return moved_name(__name__, name)
