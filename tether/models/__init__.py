"""Models: loading local Hugging Face causal LMs and tokenizers, LoRA, precision and tiny test models (``lm``); the
run's chat template and its options (``chat``); reward models with named heads (``reward``); a causal LM read as a judge (``judge``); how sequences are laid
into rows, padded, packed or as prompt-sharing trees (``packing``); vision-language models: telling one, its processor, its vision tower and
tiny random ones (``vision``); a model or tokenizer folder checked before transformers reads it (``folders``);
checks a loaded model must pass (``checks``); sharded parameters
(``shards``: FSDP2's DTensors); the count of every forward, by phase (``work``); and what torch can run on this
CPU (``cpu``).

May import: ``tether.algorithms``, ``tether.config``, ``tether.sections``, ``tether.errors``, ``tether.console``.
Nothing above it.
"""


def __getattr__(name: str):
    from tether._moved import moved_name  # tether.models.load_model and the other names of 0.1's models.py

    return moved_name(__name__, name)
