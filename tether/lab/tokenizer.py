"""Train a small byte-level BPE tokenizer with `tokenizers`, saved as a Hugging Face tokenizer.

Used by the lab, the built-in demo and the tests (no tokenizer can be
downloaded). Digits are split individually: merged digit runs make arithmetic
far harder for a tiny model (shared LAB-NOTES).
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|im_end|>", "<|pad|>"
IM_START = "<|im_start|>"

# ChatML-style: every turn ends with EOS, so a model trained on assistant turns learns to stop.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 512, with_pad: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts``, with BOS/EOS/(PAD) and a chat template."""
    specials = [BOS, EOS, IM_START] + ([PAD] if with_pad else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD if with_pad else None,
        additional_special_tokens=[IM_START],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
