"""Text in, text out: the folder's tokenizer against transformers' AutoTokenizer, on tiny tokenizers built here.

Two tokenizers are trained with the `tokenizers` library on a small corpus and saved into tiny checkpoint
folders: a byte-level BPE like Llama-3's (`<|begin_of_text|>` added by its post-processor, `<|eot_id|>`,
a chat template, generation_config.json's list of end ids) and a sentencepiece-style BPE like Llama-2's
(byte fallback, `<s>` `</s>`, add_bos_token, a normalizer that prepends "▁", which transformers'
LlamaTokenizer replaces by its own Metaspace). Ids, decoded text and chat ids equal AutoTokenizer's on
prompts with non-ASCII text and emoji; streaming gives whole characters; `Session.generate` and `turnip
generate` take text (the same tokens as the ids AutoTokenizer gives) and give the text AutoTokenizer
decodes; every bad input is one line naming the prompt, with nothing written.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from frontend.text import TextStream, jsonl_texts, load_tokenizer
from frontend.workloads import llama
from test_generate import Done, turnip, write_checkpoint
from turnip import Session
from turnip.inputs import checked_prompts
from turnip_ir.errors import InputError

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

CORPUS = ["Hello world, this is a tiny corpus for a tiny tokenizer.", "Grüße aus Köln! Ça va? Très bien, merci.",
          "日本語のテキストも少し。", "the quick brown fox jumps over the lazy dog", "Über den Fluß, and over the river again.",
          "In 2024 and 2025, not 1999."]
TEXTS = ["Hello world", "Grüße aus Köln 🙂🚀 日本語", " leading space", "Hi  there\n\nnew line", "Ça va? 👩‍👩‍👧 ok",
         "a</s>b<s>c <|eot_id|> d", "🦀", "Hello , world . isn't it ?"]
"""Non-ASCII, emoji (bytes the vocabularies only have as single bytes), a ZWJ sequence, leading and double
spaces, newlines, special tokens inside the text (which the sentencepiece-style pipelines treat differently),
and spaces before punctuation (which transformers' clean-up would remove, but not for BPE models)."""
MODEL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
         "rope_theta": 10000.0}
"""The tiny model: a vocabulary larger than the tokenizers' (as real checkpoints pad theirs)."""
LLAMA3_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if loop.first and message['role'] == 'assistant' %}
        {{ raise_exception('Conversations start with a user or system message') }}
    {% endif %}
    {% generation %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}
{% endfor %}
{% if add_generation_prompt %}
    {{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{% endif %}
{{ 'year digits: ' ~ (strftime_now('%Y') | length) if messages | length > 1 }}"""
"""Block tags on lines of their own (trim_blocks and lstrip_blocks matter), raise_exception, strftime_now and
a `{% generation %}` block, as Hub templates use them."""
BYTE_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
MEMORY = "1MiB"


def byte_level_tokenizer():
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=360, special_tokens=BYTE_SPECIALS, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 10, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def sentencepiece_tokenizer():
    """Llama-2's layout: <unk> <s> </s>, then the 256 byte pieces, then the trained pieces; a normalizer
    that prepends "▁" and turns spaces into it, no pre-tokenizer (as the Hub's Llama-2 tokenizer.json)."""
    trained = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
    trained.train_from_iterator(CORPUS * 10, tokenizers.trainers.BpeTrainer(vocab_size=180, show_progress=False,
                                                                            special_tokens=["<unk>", "<s>", "</s>"]))
    model = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    for piece in sorted(model["vocab"], key=model["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    norm = tokenizers.normalizers
    tok.normalizer = norm.Sequence([norm.Prepend("▁"), norm.Replace(" ", "▁")])
    dec = tokenizers.decoders
    tok.decoder = dec.Sequence([dec.Replace("▁", " "), dec.ByteFallback(), dec.Fuse(), dec.Strip(" ", 1, 0)])
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


FOLDERS = {
    "byte-level": (byte_level_tokenizer, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                          "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": True,
                                          "chat_template": LLAMA3_TEMPLATE}),
    "sentencepiece": (sentencepiece_tokenizer, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                                "add_bos_token": True, "add_eos_token": False, "legacy": False,
                                                "tokenizer_class": "LlamaTokenizer"}),
}


def write_folder(folder, kind: str, settings: dict | None = None, doc: dict | None = None):
    """A tiny checkpoint with the tokenizer `kind` (FOLDERS) and its tokenizer_config.json."""
    make, default = FOLDERS[kind]
    write_checkpoint(folder, {**MODEL, **(doc or {})})
    make().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(default if settings is None else settings))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("text")
    made = {kind: write_folder(root / kind, kind) for kind in FOLDERS}
    eot, end = (load_tokenizer(made["byte-level"]).backend.token_to_id(t) for t in ("<|eot_id|>", "<|end_of_text|>"))
    (made["byte-level"] / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, end]}))
    return made


def hf(folder):
    return transformers.AutoTokenizer.from_pretrained(folder)


# ----- the tokenizer ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FOLDERS)
def test_ids_and_text_equal_transformers(folders, kind):
    ours, theirs = load_tokenizer(folders[kind]), hf(folders[kind])
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours.encode(text) == ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    rng = np.random.default_rng(0)  # any ids: specials, and bytes that are not whole characters
    for _ in range(20):
        ids = rng.integers(0, theirs.backend_tokenizer.get_vocab_size(), int(rng.integers(1, 12))).tolist()
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.encode("Grüße")[0] == theirs.bos_token_id  # the post-processor's start token


def test_the_llama_tokenizer_pipeline_is_the_one_transformers_builds(folders):
    """transformers' LlamaTokenizer replaces the file's normalizer: the file alone gives other ids."""
    raw = tokenizers.Tokenizer.from_file(str(folders["sentencepiece"] / "tokenizer.json"))
    assert [raw.encode(t).ids for t in TEXTS] != [load_tokenizer(folders["sentencepiece"]).encode(t) for t in TEXTS]
    assert type(hf(folders["sentencepiece"])).__name__ == "LlamaTokenizer"


def test_a_gpt2_tokenizer_class_gets_gpt2s_pipeline(folders, tmp_path):
    """SmolLM2's layout: a llama whose tokenizer_config.json names GPT2Tokenizer, a file that splits digits;
    transformers builds GPT-2's byte-level pipeline (no digit split) and adds its <|endoftext|>."""
    folder = tmp_path / "m"
    shutil.copytree(folders["byte-level"], folder)
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, doc["pre_tokenizer"]]}
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    (folder / "tokenizer_config.json").write_text(json.dumps({**FOLDERS["byte-level"][1], "tokenizer_class": "GPT2Tokenizer"}))
    ours, theirs = load_tokenizer(folder), hf(folder)
    assert type(theirs).__name__ == "GPT2Tokenizer"
    texts = [*TEXTS, "In 2024, <|endoftext|> 1999"]
    for text in texts:
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.decode(theirs(text)["input_ids"]) == theirs.decode(theirs(text)["input_ids"], skip_special_tokens=True)
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert raw.encode(texts[-1]).ids != ours.encode(texts[-1])


def test_the_post_processor_decides_the_special_tokens(tmp_path):
    """With a tokenizer.json, transformers drops add_bos_token / add_eos_token: a file without a
    post-processor adds nothing, even where the config asks for <s>."""
    folder = write_folder(tmp_path / "m", "sentencepiece",
                          {**FOLDERS["sentencepiece"][1], "add_bos_token": True, "add_eos_token": True})
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    for text in TEXTS:
        assert load_tokenizer(folder).encode(text) == hf(folder)(text)["input_ids"]
    assert load_tokenizer(folder).encode("Hello")[0] != 1


def test_special_tokens_the_config_names_are_added_where_the_file_lacks_them(folders, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(folders["byte-level"], folder)
    settings = {**FOLDERS["byte-level"][1], "pad_token": "<|pad|>", "extra_special_tokens": ["<|tool|>"],
                "added_tokens_decoder": {"400": {"content": "<|note|>", "special": False, "normalized": False}}}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    ours, theirs = load_tokenizer(folder), hf(folder)
    for text in ("x<|pad|>y<|tool|>z", "a <|note|> b", *TEXTS):
        ids = theirs(text)["input_ids"]
        assert ours.encode(text) == ids
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert len(ours.encode("x<|pad|>y<|tool|>z")) < len(ours.encode("x<|pa d|>y<|to ol|>z"))  # each one token


CHATS = [
    [{"role": "user", "content": "Grüße aus Köln 🙂 — wie geht's?"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "日本語で 🚀"},
     {"role": "assistant", "content": "はい"}, {"role": "user", "content": "again", "name": None}],
]


@pytest.mark.parametrize("form", ["string", "named list", "template file"])
def test_chat_ids_equal_transformers(folders, tmp_path, form):
    folder = folders["byte-level"]
    if form != "string":
        folder = tmp_path / "m"
        shutil.copytree(folders["byte-level"], folder)
        settings = dict(FOLDERS["byte-level"][1])
        if form == "named list":
            settings["chat_template"] = [{"name": "tool_use", "template": "{{ 'tools' }}"},
                                         {"name": "default", "template": LLAMA3_TEMPLATE}]
        else:
            settings["chat_template"] = "{{ 'the file wins' }}"
            (folder / "chat_template.jinja").write_text(LLAMA3_TEMPLATE)
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    ours, theirs = load_tokenizer(folder), hf(folder)
    for chat in CHATS:
        for prompt in (True, False):
            ids = theirs.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=True)["input_ids"]
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt) == ids
    bos = theirs.convert_tokens_to_ids("<|begin_of_text|>")
    assert ours.apply_chat_template(CHATS[0]).count(bos) == 1  # the template's: none added again


def test_a_chat_template_that_fails_or_is_missing_is_one_line(folders):
    with pytest.raises(InputError, match="the chat template failed: Conversations start with a user or system message"):
        load_tokenizer(folders["byte-level"]).apply_chat_template([{"role": "assistant", "content": "hi"}])
    with pytest.raises(InputError, match=f"model folder '{folders['sentencepiece']}' has no chat_template"):
        load_tokenizer(folders["sentencepiece"]).apply_chat_template(CHATS[0])


def test_a_folder_without_tokenizer_json_names_the_file(tmp_path, monkeypatch):
    with pytest.raises(InputError, match=re.escape(f"'{tmp_path / 'tokenizer.json'}' does not exist")):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)
    with pytest.raises(InputError, match=re.escape("pip install 'turnip[text]'")):
        load_tokenizer(tmp_path)


def test_end_of_sequence_ids_as_hugging_face_reads_them(folders, tmp_path):
    tokenizer = load_tokenizer(folders["byte-level"])
    ids = tuple(tokenizer.backend.token_to_id(t) for t in ("<|eot_id|>", "<|end_of_text|>"))
    assert llama.load_config(str(folders["byte-level"])).eos_token_id == ids  # generation_config.json's list
    write_checkpoint(tmp_path / "m", {**MODEL, "eos_token_id": 7})
    assert llama.load_config(str(tmp_path / "m")).eos_token_id == (7,)  # config.json's, without one
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"bos_token_id": 1}))
    assert llama.load_config(str(tmp_path / "m")).eos_token_id == ()  # generation_config.json wins wholly
    model = transformers.GenerationConfig.from_pretrained(tmp_path / "m")
    assert model.eos_token_id is None
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(InputError, match="generation_config.json': eos_token_id must be an integer or a list"):
        llama.load_config(str(tmp_path / "m"))


@pytest.mark.parametrize("kind", FOLDERS)
def test_a_stream_gives_whole_characters_that_add_up_to_the_text(folders, kind):
    tokenizer = load_tokenizer(folders[kind])
    ids = tokenizer.encode("🦀 Grüße 👩‍👩‍👧 日本語 🚀") + [tokenizer.backend.token_to_id(tokenizer.special["eos_token"])]
    assert len(ids) > len("🦀 Grüße 👩‍👩‍👧 日本語 🚀".split())  # characters split over several tokens
    stream = TextStream(tokenizer)
    chunks = [stream.push([i]) for i in ids]
    chunks.append(stream.finish())
    assert "".join(chunks) == tokenizer.decode(ids)
    assert not any("\ufffd" in chunk for chunk in chunks)
    assert sum(1 for chunk in chunks if chunk) > 3  # it streams: text comes out before the end


def test_jsonl_texts_and_their_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "Grüße 🙂"}\n\n{"prompt": "two", "other": 1}\n')
    assert jsonl_texts(path, "prompt") == ["Grüße 🙂", "two"]
    bad = {b'{"prompt": "a"}\n{"text": "b"}\n': 'prompt 1 (line 2 of \'{p}\') has no "prompt"',
           b'{"prompt": "a"}\n["b"]\n': "prompt 1 (line 2 of '{p}') must be a JSON object with a \"prompt\" string, got list",
           b'{"prompt": "a"}\n\n{"prompt": "\xff"}\n': "prompt 1 (line 3 of '{p}') is not valid UTF-8",
           b'{"prompt": 3}\n': "prompt 0 (line 1 of '{p}'): \"prompt\" must be a string, got int",
           b'{"prompt": \n': "prompt 0 (line 1 of '{p}') is not JSON",
           b"\n\n": "'{p}' holds no prompts"}
    for data, message in bad.items():
        path.write_bytes(data)
        with pytest.raises(InputError, match=re.escape(message.format(p=path))):
            jsonl_texts(path, "prompt")


def test_checked_prompts_takes_text_chats_and_ids(folders):
    folder = folders["byte-level"]
    config, tokenizer = llama.load_config(str(folder)), (lambda: load_tokenizer(folder))
    theirs = hf(folder)
    assert [p.tolist() for p in checked_prompts("Grüße", config, tokenizer)] == [theirs("Grüße")["input_ids"]]
    assert [p.tolist() for p in checked_prompts([5, 6, 7], config)] == [[5, 6, 7]]  # a list of ints is one prompt
    chat = theirs.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=True)["input_ids"]
    assert checked_prompts(["x", CHATS[0]], config, tokenizer)[1].tolist() == chat
    assert checked_prompts([CHATS[0][0]["content"]], config, tokenizer, chat=True)[0].tolist() == chat
    errors = {("", None): "prompt 0 is empty text",
              ("\udcff", None): "prompt 0: the text is not valid UTF-8",
              ("ü" * 200, None): "prompt 0 is 401 tokens, more than the model's 256 positions (max_position_embeddings)",
              ("Hello", "no tokenizer"): "prompt 0: text needs the tokenizer of a weights folder"}
    for (text, how), message in errors.items():
        with pytest.raises(InputError, match=re.escape(message)):
            checked_prompts([text], config, None if how else tokenizer)


# ----- the session and the command ----------------------------------------------------------------------------
def test_a_session_takes_text_and_gives_text(folders):
    folder = folders["byte-level"]
    theirs = hf(folder)
    ids = [np.array(theirs(t)["input_ids"]) for t in ("Grüße 🙂", "Hello world")]
    steps = []
    with Session(weights=folder, memory=1 << 20, backend="cpu") as session:
        by_text = session.generate(["Grüße 🙂", "Hello world"], 4, on_step=lambda step, tokens: steps.append((step, tokens)))
        by_ids = session.generate(ids, 4)
    assert by_text.tokens.tolist() == by_ids.tokens.tolist()
    assert by_text.text == by_ids.text == [theirs.decode(row, skip_special_tokens=True) for row in by_text.tokens.tolist()]
    assert [step for step, _ in steps] == [0, 1, 2, 3]
    assert np.array_equal(np.stack([tokens for _, tokens in steps], axis=1), by_text.tokens)
    with Session(config="tiny", memory=1 << 20, backend="cpu") as session:
        assert session.generate([[1, 2, 3]], 2).text is None  # no tokenizer: no text
        with pytest.raises(InputError, match="prompt 0: text needs the tokenizer of a weights folder"):
            session.generate(["Hello"], 2)


def _cli(capsys, folder, *args):
    return turnip(capsys, "--weights", folder, "--memory", MEMORY, "--backend", "cpu", "--max-new-tokens", 4, *args)


@pytest.mark.parametrize("kind", FOLDERS)
def test_cli_text_prompts_equal_their_ids_and_transformers_text(folders, tmp_path, capsys, kind):
    folder = folders[kind]
    theirs = hf(folder)
    prompts = ["Grüße aus Köln 🙂", "日本語 🚀 Hello"]
    np.savez(tmp_path / "ids.npz", *[np.array(theirs(p)["input_ids"]) for p in prompts])
    by_ids = _cli(capsys, folder, "--input-ids", tmp_path / "ids.npz", "--outputs", tmp_path / "ids.out.npz")
    assert by_ids.returncode == 0, by_ids.stderr
    want = np.load(tmp_path / "ids.out.npz")["generated"]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    for given in (("--prompt", prompts[0], "--prompt", prompts[1]), ("--prompt-file", tmp_path / "p.jsonl")):
        done = _cli(capsys, folder, *given, "--outputs", tmp_path / "o.npz")
        assert done.returncode == 0, done.stderr
        out = np.load(tmp_path / "o.npz")
        assert out["generated"].tolist() == want.tolist()
        assert out["text"].dtype.kind == "U" and out["text"].shape == (2,)
        assert out["text"].tolist() == [theirs.decode(row, skip_special_tokens=True) for row in want.tolist()]


def test_cli_chat_prints_and_streams_the_text(folders, capsys):
    folder = folders["byte-level"]
    theirs = hf(folder)
    said = [CHATS[0][0]["content"], "Hello"]
    chats = [theirs.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)["input_ids"]
             for t in said]
    with Session(weights=folder, memory=1 << 20, backend="cpu") as session:
        want = session.generate([np.array(c) for c in chats], 4)
    text = [theirs.decode(row, skip_special_tokens=True) for row in want.tokens.tolist()]
    for stream in ((), ("--stream",)):  # one prompt: its text as it is, after the header line
        done = _cli(capsys, folder, "--prompt", said[0], "--chat", *stream)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n", 1)[1].startswith(text[0] + "\n")
    for stream in ((), ("--stream",)):  # several: every line prefixed by its prompt's index
        done = _cli(capsys, folder, "--prompt", said[0], "--prompt", said[1], "--chat", *stream)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split("\n")
        for b in (0, 1):
            mine = [line[4:] for line in lines if line.startswith(f"[{b}] ")]
            assert "".join(mine) == text[b].replace("\n", "")
            if not stream:
                assert "\n".join(mine) == text[b]


BAD = {
    "text with --config": (("--config", "tiny", "--prompt", "Hello"), 1, "--prompt needs --weights: the model folder's tokenizer.json"),
    "a prompt file with --config": (("--config", "tiny", "--prompt-file", "{no_field}"), 1, "--prompt-file needs --weights"),
    "--stream with --config": (("--config", "tiny", "--prompt-tokens", 3, "--stream"), 1, "--stream needs --weights"),
    "text with --input-ids": (("--prompt", "Hello", "--input-ids", "{ids}"), 2, "not allowed with argument"),
    "text with --prompt-tokens": (("--prompt", "Hello", "--prompt-tokens", 3), 2, "not allowed with argument"),
    "--chat without text": (("--prompt-tokens", 3, "--chat"), 1, "--chat applies the chat template to text prompts"),
    "--stream on sim": (("--prompt", "Hello", "--stream", "--backend", "sim"), 1, "so --stream needs a backend that computes"),
    "empty text": (("--prompt", "Hello", "--prompt", ""), 1, "prompt 1 is empty text"),
    "too long": (("--prompt", "ü" * 200), 1, "prompt 0 is 401 tokens, more than the model's 256 positions"),
    "no prompt field": (("--prompt-file", "{no_field}"), 1, "prompt 1 (line 2 of '{no_field}') has no \"prompt\""),
    "not an object": (("--prompt-file", "{not_object}"), 1, "prompt 0 (line 1 of '{not_object}') must be a JSON object"),
    "invalid UTF-8": (("--prompt-file", "{latin1}"), 1, "prompt 1 (line 2 of '{latin1}') is not valid UTF-8"),
    "template fails": (("--prompt", "Hi", "--chat", "--weights", "{refusing}"), 1,
                       "prompt 0: the chat template failed: no user messages here"),
    "no template": (("--prompt", "Hi", "--chat", "--weights", "{sentencepiece}"), 1, "has no chat_template"),
    "no tokenizer.json": (("--prompt", "Hi", "--weights", "{bare}"), 1, "'{bare}/tokenizer.json' does not exist"),
}


@pytest.mark.parametrize("case", BAD)
def test_cli_bad_text_input_is_one_line_and_writes_nothing(folders, tmp_path, capsys, case):
    paths = {"ids": tmp_path / "ids.npy", "no_field": tmp_path / "a.jsonl", "not_object": tmp_path / "b.jsonl",
             "latin1": tmp_path / "c.jsonl", "refusing": tmp_path / "refusing", "bare": tmp_path / "bare",
             "sentencepiece": folders["sentencepiece"]}
    np.save(paths["ids"], np.array([1, 2, 3]))
    paths["no_field"].write_text('{"prompt": "a"}\n{"text": "b"}\n')
    paths["not_object"].write_text('"a"\n')
    paths["latin1"].write_bytes('{"prompt": "a"}\n{"prompt": "Grüße"}\n'.encode("latin-1"))
    shutil.copytree(folders["byte-level"], paths["refusing"])
    settings = {**FOLDERS["byte-level"][1], "chat_template": "{{ raise_exception('no user messages here') }}"}
    (paths["refusing"] / "tokenizer_config.json").write_text(json.dumps(settings))
    write_checkpoint(paths["bare"], MODEL)
    args, code, message = BAD[case]
    args = [str(a).format(**paths) for a in args]
    source = [] if "--config" in args or "--weights" in args else ["--weights", str(folders["byte-level"])]
    backend = [] if "--backend" in args else ["--backend", "cpu"]
    out = [] if "sim" in args else ["--outputs", str(tmp_path / "o.npz")]
    try:
        done = turnip(capsys, *source, "--memory", MEMORY, "--max-new-tokens", 2, *backend, *out, *args)
    except SystemExit as refused:  # argparse's one line: flags that cannot go together
        done = Done(refused.code, *capsys.readouterr())
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("turnip generate: error: ")
    assert message.format(**paths) in lines[0]
    assert not (tmp_path / "o.npz").exists() and done.stdout == ""
