"""Data formats, the loss mask in token space, the drop policy, and every bad input's error."""

import json

import datasets
import pytest
import torch
from conftest import write_jsonl

from tether.data.records import DataError, read_records
from tether.data.sft import collate, pack_examples, tokenize_records
from tether.models.lm import load_model, load_tokenizer


def trained_text(tokenizer, ex):
    return tokenizer.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if m])


def untrained_text(tokenizer, ex):
    return tokenizer.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if not m])


def tokenize(tokenizer, rows, tmp_path, **kw):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    return tokenize_records(read_records(path), tokenizer, kw.pop("max_length", 256), path=str(path), **kw)


def test_prompt_completion_mask_trains_completion_and_eos_only(tokenizer, tmp_path):
    (ex,), report = tokenize(tokenizer, [{"prompt": "What is 12 + 7?\n", "completion": "12 + 7 = 19."}], tmp_path)
    assert trained_text(tokenizer, ex) == "12 + 7 = 19.<|im_end|>"
    assert untrained_text(tokenizer, ex) == "What is 12 + 7?\n"
    assert ex.input_ids[-1] == tokenizer.eos_token_id and ex.loss_mask[-1] == 1  # EOS is a trained label
    assert report.examples == 1 and report.trained_tokens == sum(ex.loss_mask)


def test_boundary_found_in_token_space_when_bpe_merges_across_it(tokenizer, tmp_path):
    # "cats" is one BPE token in this vocabulary; the prompt ends in the middle of it.
    assert len(tokenizer("cats", add_special_tokens=False)["input_ids"]) == 1
    (ex,), _ = tokenize(tokenizer, [{"prompt": "Tell me about ca", "completion": "ts."}], tmp_path)
    # The sequence is tokenised once (the merged token appears, not "ca" + "ts"); the straddling token is trained.
    assert ex.input_ids == tokenizer("Tell me about cats.<|im_end|>", add_special_tokens=False)["input_ids"]
    assert trained_text(tokenizer, ex) == " cats.<|im_end|>"


def test_train_on_prompt_trains_everything_but_the_first_token(tokenizer, tmp_path):
    (ex,), _ = tokenize(tokenizer, [{"prompt": "Hi ", "completion": "there"}], tmp_path, train_on_prompt=True)
    assert ex.loss_mask[0] == 0 and all(ex.loss_mask[1:])


def test_messages_train_every_assistant_turn_up_to_eos(tokenizer, tmp_path):
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "how are you?"},
        {"role": "assistant", "content": "fine"},
    ]
    (ex,), report = tokenize(tokenizer, [{"messages": messages}], tmp_path)
    assert report.format == "messages"
    assert trained_text(tokenizer, ex) == "hi<|im_end|>fine<|im_end|>"  # not the newline after EOS, not user turns


def test_conversational_prompt_completion_trains_only_the_completion(tokenizer, tmp_path):
    row = {
        "prompt": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "and?"},
        ],
        "completion": [{"role": "assistant", "content": "fine"}],
    }
    (ex,), _ = tokenize(tokenizer, [row], tmp_path)
    assert trained_text(tokenizer, ex) == "fine<|im_end|>"


def test_text_format_trains_all_tokens_and_appends_eos(tokenizer, tmp_path):
    (ex,), report = tokenize(tokenizer, [{"text": "Cats are mammals."}], tmp_path)
    assert report.format == "text"
    assert trained_text(tokenizer, ex) == tokenizer.decode(ex.input_ids[1:])
    assert ex.input_ids[-1] == tokenizer.eos_token_id


def test_empty_completion_and_overlong_are_dropped_and_counted(tokenizer, tmp_path):
    rows = [
        {"prompt": "a", "completion": "  "},
        {"prompt": "b", "completion": "ok"},
        {"prompt": "c", "completion": "x" * 300},
    ]
    examples, report = tokenize(tokenizer, rows, tmp_path, max_length=64)
    assert len(examples) == 1
    assert report.dropped == {"empty completion": 1, "longer than max_length=64 tokens": 1}
    assert "1 empty completion" in report.summary() and "--strict" in report.summary()


def test_strict_turns_a_drop_into_an_error_naming_the_line(tokenizer, tmp_path):
    rows = [{"prompt": "b", "completion": "ok"}, {"prompt": "a", "completion": ""}]
    with pytest.raises(DataError, match=r"d.jsonl:2: example empty completion \(--strict\)"):
        tokenize(tokenizer, rows, tmp_path, strict=True)
    rows = [{"prompt": "c", "completion": "x" * 300}]
    with pytest.raises(DataError, match=r"d.jsonl:1: example longer than max_length=64"):
        tokenize(tokenizer, rows, tmp_path, strict=True, max_length=64)


def test_strict_names_the_first_bad_record_whichever_check_finds_it(tokenizer, tmp_path):
    # Line 2 fails only once tokenised (too long), line 3 already when rendered (empty): records are taken in order.
    rows = [
        {"prompt": "b", "completion": "ok"},
        {"prompt": "c", "completion": "x" * 300},
        {"prompt": "a", "completion": ""},
    ]
    with pytest.raises(DataError, match=r"d.jsonl:2: example longer than max_length=64"):
        tokenize(tokenizer, rows, tmp_path, strict=True, max_length=64)


def test_tokenising_in_chunks_equals_one_record_at_a_time(tokenizer, tmp_path):
    # 1,100 records span three of tokenize_records' 512-record chunks, with drops inside them and across a boundary.
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"q {i}"},
                {"role": "assistant", "content": "" if i % 97 == 5 else f"answer {i} " * (1 + i % 9)},
            ]
        }
        for i in range(1100)
    ]
    examples, report = tokenize(tokenizer, rows, tmp_path, max_length=40)
    kept = [i for i, r in enumerate(rows) if r["messages"][1]["content"]]
    one_at_a_time = []
    for i in kept:
        alone = tmp_path / f"record{i}"
        alone.mkdir()
        (ex,), _ = tokenize(tokenizer, [rows[i]], alone, max_length=10_000)
        if len(ex.input_ids) <= 40:
            one_at_a_time.append((ex.input_ids, ex.loss_mask, f"{i + 1}"))
    assert report.dropped["empty completion"] == 1100 - len(kept) > 0
    assert report.dropped["longer than max_length=40 tokens"] == len(kept) - len(one_at_a_time) > 0
    assert [(ex.input_ids, ex.loss_mask, ex.where.rsplit(":", 1)[1]) for ex in examples] == one_at_a_time


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n\n{"prompt": "a", "completion": }\n')
    with pytest.raises(DataError, match=r"bad.jsonl:3: not valid JSON"):
        read_records(path)


def test_non_object_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('["a", "b"]\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: expected a JSON object"):
        read_records(path)


def test_missing_field_lists_fields_present_and_formats_accepted(tokenizer, tmp_path):
    with pytest.raises(DataError) as err:
        tokenize(tokenizer, [{"question": "q", "answer": "a"}], tmp_path)
    msg = str(err.value)
    assert "d.jsonl:1" in msg and "['answer', 'question']" in msg
    assert "prompt/completion" in msg and "messages" in msg and "--columns" in msg


def test_field_of_wrong_type_names_line_and_field(tokenizer, tmp_path):
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": 5}]
    with pytest.raises(DataError, match=r"d.jsonl:2: field 'completion' must be a string, got int"):
        tokenize(tokenizer, rows, tmp_path)


def test_bad_message_names_the_message(tokenizer, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}]
    with pytest.raises(DataError, match=r"d.jsonl:1: field messages\[1\] must be an object with 'role' and 'content'"):
        tokenize(tokenizer, rows, tmp_path)


def test_mixed_formats_in_one_file_are_an_error(tokenizer, tmp_path):
    with pytest.raises(DataError, match=r"d.jsonl:2: record is text but earlier records are prompt/completion"):
        tokenize(tokenizer, [{"prompt": "a", "completion": "b"}, {"text": "c"}], tmp_path)


def test_messages_without_chat_template_is_a_clear_error(tokenizer, tmp_path):
    import copy

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(DataError, match="chat template"):
        tokenize(
            plain, [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}], tmp_path
        )


def test_column_mapping(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "What?", "answer": " This."}])
    records = read_records(path, "prompt=question,completion=answer")
    (ex,), _ = tokenize_records(records, tokenizer, 64)
    assert trained_text(tokenizer, ex) == " This.<|im_end|>"
    with pytest.raises(DataError, match="source column"):
        read_records(path, "prompt=query,completion=answer")
    with pytest.raises(DataError, match="NAME=SOURCE"):
        read_records(path, "prompt")


def test_json_parquet_and_saved_dataset_read_the_same_records(tmp_path):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(3)]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "folder"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    for path in ("d.json", "d.parquet", "folder", "dict"):
        assert [r.fields for r in read_records(tmp_path / path)] == rows, path
    assert read_records(tmp_path / "d.parquet")[1].where.endswith("d.parquet row 2")
    assert len(read_records(tmp_path / "dict", split="test")) == 1
    with pytest.raises(DataError, match=r"has splits \['test', 'train'\], not 'valid'"):
        read_records(tmp_path / "dict", split="valid")
    with pytest.raises(DataError, match="unknown data format '.tsv'"):
        (tmp_path / "d.tsv").write_text("a\tb\n")
        read_records(tmp_path / "d.tsv")
    with pytest.raises(DataError, match="no such file"):
        read_records(tmp_path / "missing.jsonl")


def test_collate_right_pads_and_masks(tokenizer):
    from tether.data.sft import Example

    batch = collate([Example([5, 6, 7], [0, 1, 1], "a"), Example([8, 9], [0, 1], "b")], pad_id=tokenizer.pad_token_id)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, tokenizer.pad_token_id]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_packing_gives_the_same_logits_as_separate_examples(arch, model_dirs, tokenizer, tmp_path):
    rows = [
        {"prompt": "What is 1 + 2?\n", "completion": "1 + 2 = 3."},
        {"prompt": "Tell me about cats.", "completion": " Cats sleep a lot."},
        {"prompt": "hello", "completion": " there"},
    ]
    examples, _ = tokenize(tokenizer, rows, tmp_path)
    (row,) = pack_examples(examples, max_length=200)
    assert row.position_ids[: len(examples[0].input_ids)] == list(range(len(examples[0].input_ids)))
    tok = load_tokenizer(model_dirs[arch])
    model = load_model(model_dirs[arch], tok).eval()
    with torch.no_grad():
        packed = collate([row], tok.pad_token_id)
        packed_logits = model(
            input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False
        ).logits[0]
        start = 0
        for ex in examples:
            alone = model(input_ids=torch.tensor([ex.input_ids]), use_cache=False).logits[0]
            torch.testing.assert_close(packed_logits[start : start + len(ex.input_ids)], alone, atol=1e-5, rtol=1e-4)
            start += len(ex.input_ids)


def test_rl_prompt_files_are_checked_row_by_row(tmp_path):
    from tether.data.prompts import prompt_rows

    def check(rows, match):
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(DataError, match=match):
            prompt_rows(path)

    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty.jsonl: no prompts"):
        prompt_rows(tmp_path / "empty.jsonl")
    check([{"prompt": "a", "answer": 1}, {"prompt": "  ", "answer": 2}], r"prompts.jsonl:2: 'prompt' is empty")
    check([{"prompt": [{"content": "hi"}]}], r"prompts.jsonl:1: prompt message 0 must be \{'role'")
    check([{"prompt": [{"role": "wizard", "content": "hi"}]}], "one of system, user, assistant, tool")
    check([{"question": "a"}], r"prompts.jsonl:1: 'prompt' must be .* \(the row has \['question'\]\)")
    check(
        [{"prompt": "a", "answer": 1}, {"prompt": "b"}], r"prompts.jsonl:2: the columns differ .* missing \['answer'\]"
    )
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": 3}) + "\n")
    assert prompt_rows(good) == [{"prompt": [{"role": "user", "content": "hi"}], "answer": 3}]


def test_invalid_utf8_unknown_roles_and_empty_files_are_named(tmp_path, tokenizer):
    from tether.data.records import split_records
    from tether.data.sft import tokenize_records

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid UTF-8"):
        read_records(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_bytes(b'[\n{"text": "a"},\n{"text": "\xff"}\n]')
    with pytest.raises(DataError, match=r"bad.json:3: not valid UTF-8"):
        read_records(bad_json)
    wizard = write_jsonl(
        tmp_path / "wizard.jsonl",
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "poof"}]}],
    )
    with pytest.raises(DataError, match=r"wizard.jsonl:1: field messages\[1\].role is 'wizard'; roles are"):
        tokenize_records(read_records(wizard), tokenizer, 64)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty.jsonl: no records"):
        split_records(read_records(tmp_path / "empty.jsonl"), 0.1, 0, tmp_path / "empty.jsonl")


def test_csv_hub_layout_folders_sharegpt_and_content_parts_are_read(tmp_path, tokenizer):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(4)]
    (tmp_path / "d.csv").write_text("prompt,completion\n" + "".join(f"p{i},c{i}\n" for i in range(4)))
    assert [r.fields for r in read_records(tmp_path / "d.csv")] == rows
    assert read_records(tmp_path / "d.csv")[0].where.endswith("d.csv:2")  # the line, header counted
    (tmp_path / "bad.csv").write_text("prompt,completion\np,c,extra\n")
    with pytest.raises(DataError, match=r"bad.csv:2: more cells than the header"):
        read_records(tmp_path / "bad.csv")
    hub = tmp_path / "hub" / "data"  # as a dataset repository stores its splits
    hub.mkdir(parents=True)
    datasets.Dataset.from_list(rows[:2]).to_parquet(str(hub / "train-00000-of-00002.parquet"))
    datasets.Dataset.from_list(rows[2:]).to_parquet(str(hub / "train-00001-of-00002.parquet"))
    write_jsonl(hub / "test.jsonl", rows[:1])
    assert [r.fields for r in read_records(tmp_path / "hub")] == rows
    assert len(read_records(tmp_path / "hub", split="test")) == 1
    with pytest.raises(DataError, match=r"no data files for split 'valid'; files start with \['test', 'train'\]"):
        read_records(tmp_path / "hub", split="valid")
    sharegpt = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "Hi"},
                    {"from": "gpt", "value": "Hello."},
                ]
            }
        ],
    )
    (record,) = read_records(sharegpt)
    assert record.fields == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
        ]
    }
    (ex,), _ = tokenize_records([record], tokenizer, 64)
    assert trained_text(tokenizer, ex) == "Hello.<|im_end|>"
    parts = write_jsonl(
        tmp_path / "parts.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                ]
            }
        ],
    )
    assert read_records(parts)[0].fields["messages"][0] == {"role": "user", "content": "Hi there"}
    # image parts are kept, for a vision-language model (tests/test_multimodal.py); other parts are refused
    image = write_jsonl(tmp_path / "image.jsonl", [{"messages": [{"role": "user", "content": [{"type": "image"}]}]}])
    assert read_records(image)[0].fields["messages"][0]["content"] == [{"type": "image"}]
    audio = write_jsonl(tmp_path / "audio.jsonl", [{"messages": [{"role": "user", "content": [{"type": "audio"}]}]}])
    with pytest.raises(DataError, match=r"audio.jsonl:1: messages\[0\].content has a 'audio' part; tether reads text"):
        read_records(audio)


def test_columns_the_format_does_not_read_are_named(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b", "source": "web", "id": 1}])
    _, report = tokenize_records(read_records(path), tokenizer, 64)
    assert report.unused == ["id", "source"] and "columns not used: id, source" in report.summary()


def test_unpaired_preference_data_is_not_trained_as_sft(tmp_path, tokenizer):
    path = write_jsonl(
        tmp_path / "kto.jsonl",
        [{"prompt": "a", "completion": "good", "label": True}, {"prompt": "a", "completion": "bad", "label": False}],
    )
    with pytest.raises(DataError, match=r"kto.jsonl:1: unpaired preference data .* labelled false"):
        tokenize_records(read_records(path), tokenizer, 64)


def test_tool_call_turns_are_kept_structured_and_a_template_without_calls_gets_hermes_text(tmp_path, tokenizer):
    path = write_jsonl(
        tmp_path / "tools.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "Weather in Oslo?"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
                        ],
                    },
                    {"role": "tool", "content": "rain"},
                    {"role": "assistant", "content": "It rains."},
                ]
            }
        ],
    )
    (record,) = read_records(path)
    call = record.fields["messages"][1]
    assert call == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
    }
    from tether.agents.tools import parse_tool_calls

    (ex,), _ = tokenize_records([record], tokenizer, 256)
    trained = trained_text(tokenizer, ex)  # this template writes no tool calls: the Hermes text tether's parser reads
    assert trained.startswith('<tool_call>\n{"name": "weather"')  # both assistant turns trained
    assert parse_tool_calls(trained) == [{"name": "weather", "arguments": {"city": "Oslo"}}]
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [{"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}]}],
    )
    with pytest.raises(DataError, match=r"bad.jsonl:1: messages\[0\].tool_calls\[0\] must be"):
        read_records(bad)


def test_eval_data_from_the_training_folder_reads_its_eval_split_and_the_same_split_is_refused(tmp_path):
    """--data ds --eval-data ds read the training split twice: the model was evaluated on the rows it trained on."""
    from tether.config import ConfigError, build_config
    from tether.stages.sft_config import SFTConfig
    from tether.train.offline_run import read_split

    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(3)]
    ds = datasets.Dataset.from_list(rows)
    datasets.DatasetDict({"train": ds, "test": ds.select([2])}).save_to_disk(str(tmp_path / "dict"))
    folder = str(tmp_path / "dict")
    cfg = build_config(SFTConfig, overrides={"data.path": folder, "data.eval_path": folder})
    seen = []
    read_split(cfg, lambda recs, label, limit: (seen.append([r.fields for r in recs]), None))
    assert seen == [rows, rows[2:]]  # the training split's three rows, then the test split's one
    with pytest.raises(ConfigError, match=r"eval_path='.*dict' is the training data itself \(path, split 'train'\)"):
        build_config(SFTConfig, overrides={"data.path": folder, "data.eval_path": folder, "data.eval_split": "train"})
    # one file named twice is the user's choice in plain sight (tests evaluate on their training file): not refused
    one = str(write_jsonl(tmp_path / "d.jsonl", rows))
    assert build_config(SFTConfig, overrides={"data.path": one, "data.eval_path": one}).data.eval_path == one


def test_csv_true_false_cells_are_booleans_a_bom_is_dropped_and_a_row_is_named_by_its_first_line(tmp_path):
    """A KTO CSV's label column stayed the strings 'true'/'false' (KTO refused it, SFT trained on answers labelled
    false); Excel's UTF-8 BOM became part of the first column's name; a quoted multi-line cell named its last line."""
    from tether.data.preferences import preference_format

    (tmp_path / "kto.csv").write_text("prompt,completion,label\nQ1?, good,true\nQ2?, bad,FALSE\n")
    records = read_records(tmp_path / "kto.csv")
    assert [r.fields["label"] for r in records] == [True, False] and preference_format(records, "kto.csv") == "unpaired"
    (tmp_path / "bom.csv").write_bytes("\ufeffprompt,completion\nQ,A\n".encode())
    assert [r.fields for r in read_records(tmp_path / "bom.csv")] == [{"prompt": "Q", "completion": "A"}]
    (tmp_path / "lines.csv").write_text('prompt,completion\n\nQ1,"a\nb"\n\nQ2,"c\nd\ne",x\n')
    with pytest.raises(DataError, match=r"lines.csv:6: more cells than the header"):  # lines 6-8: named by 6
        read_records(tmp_path / "lines.csv")
    (tmp_path / "lines.csv").write_text('prompt,completion\n\nQ1,"a\nb"\n\nQ2,"c\nd"\n')
    assert [r.where.rsplit(":", 1)[1] for r in read_records(tmp_path / "lines.csv")] == ["3", "6"]


def test_columns_rename_a_llamafactory_datasets_own_columns_before_it_is_read(tmp_path):
    """--columns was silently ignored for dataset_info.json:NAME: the rename came after the rows were normalised."""
    (tmp_path / "dataset_info.json").write_text(json.dumps({"demo": {"file_name": "a.json"}}))
    (tmp_path / "a.json").write_text(json.dumps([{"question": "Q?", "output": "A."}]))
    spec = f"{tmp_path / 'dataset_info.json'}:demo"
    (record,) = read_records(spec, "instruction=question")
    assert record.fields["messages"] == [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    with pytest.raises(DataError, match=r"a.json: --columns names source column\(s\) \['query'\]"):
        read_records(spec, "instruction=query")
