"""Chat templates written here that behave as the model families agents are trained on do (none is a copy of a
model's template): how each lists tools, writes an assistant's tool calls, shows tool results, and what it does to
earlier turns and to the generation prompt. tests/test_agent_families.py runs episodes through each."""

# Qwen2.5 / Hermes style: tools in a system turn, calls as <tool_call> JSON, results grouped in one user turn.
QWEN25 = """{%- if tools %}<|im_start|>system
Tools:
{% for t in tools %}{{ t | tojson }}
{% endfor %}Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}{{ "\n" }}<tool_response>
{{ m.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}
{%- for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama 3.1 style: header tokens, tools in the first user turn with the "parameters" instruction, calls as bare
# JSON closed by <|eot_id|>, one call per turn (it refuses two), results in an ipython turn.
LLAMA3 = """{{ bos_token }}
{%- for m in messages %}
{%- if m.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>

Answer with a function call as {"name": function name, "parameters": dictionary of argument name and its value}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}{{ m.content }}<|eot_id|>
{%- elif m.role == 'assistant' and m.tool_calls %}
{%- if m.tool_calls | length > 1 %}{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}<|start_header_id|>assistant<|end_header_id|>

{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Mistral v0.3 style: user and assistant must alternate (tool traffic aside), call ids of 9 characters on calls
# and results alike, tools before the last user turn.
MISTRAL = """{%- set users = messages | selectattr('role', 'equalto', 'user') | list %}{{ bos_token }}
{%- set ns = namespace(last='') %}
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if ns.last == 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}
{%- if tools and m == users[-1] %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]
{%- set ns.last = 'user' %}
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][
{%- for c in m.tool_calls %}
{%- if c.id is not defined or c.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, "id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}
{%- endfor %}]{{ eos_token }}
{%- set ns.last = 'calls' %}
{%- elif m.role == 'assistant' %}
{%- if ns.last != 'user' and ns.last != 'tool' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}
{{- m.content }}{{ eos_token }}
{%- set ns.last = 'assistant' %}
{%- elif m.role == 'tool' %}
{%- if ns.last != 'calls' and ns.last != 'tool' %}{{ raise_exception('A tool result must follow a tool call') }}{% endif %}
{%- if m.tool_call_id is not defined or m.tool_call_id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
[TOOL_RESULTS]{"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- set ns.last = 'tool' %}
{%- endif %}
{%- endfor %}"""

# Qwen3 style: an assistant turn's <think> block is kept only after the last user query (and always on the
# last message); enable_thinking=false puts an empty think block in the generation prompt.
QWEN3 = """{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}
{%- if tools %}<|im_start|>system
{% for t in tools %}{{ t | tojson }}
{% endfor %}Call tools as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- set content = m.content %}{% set reasoning = '' %}
{%- if '</think>' in content %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}
{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}<|im_start|>assistant
<think>
{{ reasoning }}
</think>

{{ content }}
{%- else %}<|im_start|>assistant
{{ content }}
{%- endif %}
{%- for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""

# DeepSeek-R1 style: system messages first, no tools= of its own; <think> in the generation prompt, never rendered
# back; reasoning stripped from earlier turns; calls and results in DeepSeek's tokens, the arguments joined in as a
# string.
R1 = """{{ bos_token }}
{%- for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' and m.tool_calls %}<｜Assistant｜>{{ m.content }}<｜tool▁calls▁begin｜>
{%- for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}
```json
{{ c.function.arguments + '' }}
```<｜tool▁call▁end｜>
{%- endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
{%- elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content.split('</think>')[-1] }}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜><think>
{% endif %}"""

# Hermes 3 style: two named templates; only tool_use lists tools, its tool results must carry a name, and a result
# that is not the conversation's last message gets a newline before its end (its rendering depends on what follows).
HERMES_DEFAULT = """{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

HERMES_TOOL_USE = """<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>
{% for m in messages %}
{%- if m.role == 'tool' %}
{%- if m.name is not defined %}{{ raise_exception('tool messages need a name') }}{% endif %}<|im_start|>tool
<tool_response>
{"name": "{{ m.name }}", "content": {{ m.content | tojson }}}
</tool_response>{% if not loop.last %}{{ "\n" }}{% endif %}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}
{%- for c in m.tool_calls or [] %}
<tool_call>
{"arguments": {{ c.function.arguments | tojson }}, "name": "{{ c.function.name }}"}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Hermes 2 Pro style: the call's arguments before its name, no content in a call turn, results with their name.
HERMES2PRO = """{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Call a function as <tool_call>{"name": <function-name>, "arguments": <args-dict>}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"arguments": {{ c.function.arguments | tojson }}, "name": "{{ c.function.name }}"}
</tool_call>
{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>tool
<tool_response>
{"name": "{{ m.name }}", "content": {{ m.content | tojson }}}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Gemma 3 style: user and model turns only (no tool role, no system role of its own), contents trimmed, turns
# closed by <end_of_turn> while the tokenizer's EOS is <eos>.
GEMMA3 = """{{ bos_token }}
{%- for m in messages %}
{%- if m.role not in ('user', 'assistant') %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}
{{ m.content | trim }}<end_of_turn>
{% endfor %}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif %}"""

# Kimi K2 style: tools declared in a system turn, calls in its own section tokens, each written by its id (no
# name: the id carries it) and its arguments.
KIMI = """{%- if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_assistant|>assistant<|im_middle|>{{ m.content }}<|tool_calls_section_begin|>
{%- for c in m.tool_calls %}<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|><|im_end|>
{%- elif m.role == 'tool' %}<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}
{{ m.content }}<|im_end|>
{%- else %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"""

# Phi-4-mini style: its text says "tools", but it reads them from a system message's own field and ignores tools=.
PHI4 = """{%- for m in messages %}
{%- if m.role == 'system' and m.tools %}<|system|>{{ m.content }}<|tool|>{{ m.tools }}<|/tool|><|end|>
{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""

# (special tokens the family's tokenizer has, its EOS, its template(s))
FAMILIES = {
    "qwen2.5": (["<tool_call>", "</tool_call>"], "<|im_end|>", QWEN25),
    "llama3": (
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|end_of_text|>"],
        "<|eot_id|>",
        LLAMA3,
    ),
    "mistral": (
        [
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "</s>",
        ],
        "</s>",
        MISTRAL,
    ),
    "qwen3": ([], "<|im_end|>", QWEN3),
    "r1": (
        [
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜end▁of▁sentence｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁outputs▁begin｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
            "<｜tool▁outputs▁end｜>",
        ],
        "<｜end▁of▁sentence｜>",
        R1,
    ),
    "hermes3": ([], "<|im_end|>", {"default": HERMES_DEFAULT, "tool_use": HERMES_TOOL_USE}),
    "hermes2pro": ([], "<|im_end|>", HERMES2PRO),
    "gemma3": (["<start_of_turn>", "<end_of_turn>", "<eos>"], "<eos>", GEMMA3),
    "kimi": (
        [
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|im_end|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ],
        "<|im_end|>",
        KIMI,
    ),
    "phi4": (["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|/tool|>", "<|end|>"], "<|end|>", PHI4),
}


def family_tokenizer(base_dir, family: str):
    """The tests' BPE tokenizer (saved in ``base_dir``) with the family's special tokens, EOS and template(s)."""
    from transformers import AutoTokenizer

    specials, eos, template = FAMILIES[family]
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials}, replace_extra_special_tokens=False)
    tok.eos_token = eos
    tok.chat_template = template
    return tok
