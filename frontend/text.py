"""Text to token ids and back with a model folder's own tokenizer, as transformers' `AutoTokenizer` does.

A `Tokenizer` is the folder's `tokenizer.json` read by the `tokenizers` library (the `text` extra, imported
on first use), adjusted the way transformers 5 adjusts it when it loads the folder, so that `encode(text)`
equals `AutoTokenizer.from_pretrained(folder)(text)["input_ids"]` and `decode` equals its `decode`:
- Special tokens added by `encode` are the tokenizer.json post-processor's: with a tokenizer.json present,
  transformers drops tokenizer_config.json's `add_bos_token` / `add_eos_token` and keeps the post-processor
  (none: nothing is added). The named special tokens (every `*_token` of tokenizer_config.json, else of the
  legacy special_tokens_map.json), `extra_special_tokens` and `added_tokens_decoder` are added as special
  tokens where tokenizer.json does not have them. Truncation and padding stored in the file are off.
- The class: where transformers picks a class with its own pipeline (tokenizer_class `LlamaTokenizer[Fast]`
  for a `llama` model whose tokenizer.json is not byte-level, or `GPT2Tokenizer[Fast]`, as SmolLM2 names;
  mistral and qwen2 models load the file as it is), it builds that pipeline around the file's vocabulary,
  and so does this. LlamaTokenizer: no normalizer, a Metaspace pre-tokenizer that prepends "▁" to the
  first piece only (every piece when `legacy`, none without `add_prefix_space`) and a decoder that undoes
  it (other ids than a Llama-2 file's, which prepends in a normalizer). GPT2Tokenizer: GPT-2's byte-level
  pre-tokenizer alone (a file's digit splitting is dropped). Each class's default special tokens apply.
- `decode` cleans up tokenization spaces where transformers does: `clean_up_tokenization_spaces`, never
  for a BPE model (unless forced by the config).
Chat templates: `chat_template.jinja` (and `additional_chat_templates/*.jinja`) in the folder, else
tokenizer_config.json's `chat_template` (a string, or a list of named templates: "default" is used),
rendered as transformers renders them (a sandboxed jinja2 environment with trim_blocks and lstrip_blocks,
`raise_exception`, `strftime_now`, `tojson`, the special tokens as variables) and encoded without adding
special tokens again. `TextStream` turns a sequence's tokens into text as they arrive, `jsonl_texts`
reads plain text from JSON Lines files. Every problem is one `InputError` line naming the file or the text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path

from turnip_ir.errors import InputError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
LEGACY_SPECIAL_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
INSTALL = "text needs the tokenizers and jinja2 packages: pip install 'turnip[text]'"
CLASS_DEFAULTS = {
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "GPT2Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
}
"""The classes whose own pipeline transformers builds around a tokenizer.json (module docstring), with the
special tokens each assumes where tokenizer_config.json does not name them."""
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
"""transformers' `clean_up_tokenization`, in its order."""


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a model folder, or a one-line error naming the file looked for."""
    folder = Path(folder)
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise InputError(f"text needs the model folder's own tokenizer, and '{path}' does not exist")
    try:
        import tokenizers
    except ImportError:
        raise InputError(INSTALL) from None
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as err:  # the library raises its own Exception subclass for any unreadable file
        raise InputError(f"tokenizer '{path}' cannot be read: {_first_line(err)}") from None
    settings = _json(folder / CONFIG_FILE)
    return Tokenizer(backend, settings, _model(folder), folder)


class Tokenizer:
    """Text to ids and back (module docstring): `encode`, `decode`, `apply_chat_template`."""

    def __init__(self, backend, settings: dict, model: dict, folder: Path):
        import tokenizers

        self.backend = backend
        self.settings = settings
        self.folder = folder
        backend.no_truncation()
        backend.no_padding()
        rebuilt = _rebuilt_class(settings, model, folder / TOKENIZER_FILE)
        if rebuilt is not None:
            _class_pipeline(rebuilt, backend, settings)
        self.special = _special_tokens(settings, folder, CLASS_DEFAULTS.get(rebuilt, {}))
        """Named special tokens (`bos_token`, `eos_token`, ...) -> their text; the chat template sees them."""
        backend.add_tokens(self._missing_tokens(tokenizers))
        backend.encode_special_tokens = bool(settings.get("split_special_tokens", False))

    def encode(self, text: str) -> list[int]:
        """The ids transformers' tokenizer gives for `text`, with the special tokens its post-processor adds."""
        return self._encode(text, add_special_tokens=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`, as transformers' `decode` gives it."""
        text = self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self._cleans_up:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text

    @property
    def chat_template(self) -> str | None:
        """The template `apply_chat_template` renders: the folder's default one, or None."""
        templates = self._templates
        if isinstance(templates, str) or templates is None:
            return templates
        return templates.get("default")

    def render_chat(self, messages: Sequence[Mapping], add_generation_prompt: bool = True) -> str:
        """The conversation as the chat template writes it, or a one-line error (no template, or it failed)."""
        template = self._compiled_template
        chat = [{key: value for key, value in dict(message).items() if value is not None} for message in messages]
        try:
            return template.render(messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
                                   **self.special)
        except Exception as err:  # a template is a program: whatever it raises is its failure on this conversation
            raise InputError(f"the chat template failed: {_first_line(err)}") from None

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = True) -> list[int]:
        """The ids of the rendered conversation; special tokens are the template's, none added again."""
        return self._encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # lone surrogates: bytes that were not UTF-8 where the text came from
            raise InputError(f"the text is not valid UTF-8 (at character {err.start})") from None
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def _missing_tokens(self, tokenizers) -> list:
        """What transformers adds to the file's tokens, in its order (new ones get the next ids): the config's
        `added_tokens_decoder` by index, the named special tokens, then `extra_special_tokens`."""
        declared = dict(self.settings.get("added_tokens_decoder") or {})
        order = sorted(declared, key=lambda key: int(key) if str(key).isdigit() else -1)
        tokens = [_added_token(tokenizers, declared[key]) for key in order
                  if isinstance(declared[key], Mapping) and isinstance(declared[key].get("content"), str)]
        listed = self.settings.get("extra_special_tokens") or self.settings.get("additional_special_tokens") or []
        texts = [*self.special.values(), *filter(None, map(_token_text, listed if isinstance(listed, list) else []))]
        tokens += [tokenizers.AddedToken(text, special=True, normalized=False) for text in texts]
        missing, known = [], {str(token.content) for token in self.backend.get_added_tokens_decoder().values()}
        for token in tokens:
            if token.content not in known:
                missing.append(token)
                known.add(token.content)
        return missing

    @property
    def _cleans_up(self) -> bool:
        if not self.settings.get("clean_up_tokenization_spaces", False):
            return False
        forced = self.settings.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
        return forced or type(self.backend.model).__name__ != "BPE"

    @cached_property
    def _templates(self) -> str | dict[str, str] | None:
        """transformers' order: template files in the folder win over tokenizer_config.json's entry."""
        files = {}
        if (self.folder / TEMPLATE_FILE).is_file():
            files["default"] = _read_text(self.folder / TEMPLATE_FILE)
        for path in sorted((self.folder / TEMPLATE_DIR).glob("*.jinja")):
            files[path.name.removesuffix(".jinja")] = _read_text(path)
        if files:
            return files["default"] if list(files) == ["default"] else files
        given = self.settings.get("chat_template")
        if isinstance(given, list):
            return {entry["name"]: entry["template"] for entry in given if isinstance(entry, Mapping) and {"name", "template"} <= set(entry)}
        return given if isinstance(given, str) else None

    @cached_property
    def _compiled_template(self):
        template = self.chat_template
        if template is None:
            names = sorted(self._templates) if isinstance(self._templates, dict) else []
            has = f"only the named templates {', '.join(names)}" if names else f"no chat_template in {CONFIG_FILE} and no {TEMPLATE_FILE}"
            raise InputError(f"model folder '{self.folder}' has {has}: there is no chat template to apply")
        try:
            return _environment().from_string(template)
        except ImportError:
            raise InputError(INSTALL) from None
        except Exception as err:  # jinja2's TemplateSyntaxError, with the line it stopped at
            raise InputError(f"the chat template of '{self.folder}' does not parse: {_first_line(err)}") from None


class TextStream:
    """One sequence's text as its tokens arrive: `push` returns only the text that is complete.

    The whole prefix is decoded each time and what is new is returned, so a character whose bytes span
    several tokens comes out whole: while the decoded text ends in U+FFFD (the bytes so far are not a whole
    character yet) nothing is returned, and `finish` returns whatever is left."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.shown = ""

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self.ids, self.skip_special_tokens)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            return ""
        return self._show(text)

    def finish(self) -> str:
        return self._show(self.tokenizer.decode(self.ids, self.skip_special_tokens))

    def _show(self, text: str) -> str:
        same = len(self.shown) if text.startswith(self.shown) else _common_prefix(text, self.shown)
        new, self.shown = text[same:], text
        return new


def jsonl_texts(path: str | Path, field: str, what: str = "prompt") -> list[str]:
    """The `field` string of each non-blank line of a JSON Lines file, or one line naming the entry (`what`
    and its index) and its line number."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"file '{path}' cannot be read: {err.strerror or err}") from None
    texts = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{what} {len(texts)} (line {number} of '{path}')"
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise InputError(f"{where} is not valid UTF-8 (byte {err.start} of the line)") from None
        except json.JSONDecodeError as err:
            raise InputError(f"{where} is not JSON: {err.msg} at column {err.colno}") from None
        if not isinstance(doc, dict):
            raise InputError(f'{where} must be a JSON object with a "{field}" string, got {type(doc).__name__}')
        if field not in doc:
            raise InputError(f'{where} has no "{field}"')
        if not isinstance(doc[field], str):
            raise InputError(f'{where}: "{field}" must be a string, got {type(doc[field]).__name__}')
        texts.append(doc[field])
    if not texts:
        raise InputError(f"'{path}' holds no {what}s")
    return texts


# ----- what transformers does on load -------------------------------------------------------------------
def _rebuilt_class(settings: dict, model: dict, path: Path) -> str | None:
    """The class of CLASS_DEFAULTS that AutoTokenizer builds here (models/auto/tokenization_auto.py), or None
    where it loads the file as it is: the class named in tokenizer_config.json or config.json, for a `llama`
    model (mistral and qwen2 have classes registered that load the file), and LlamaTokenizer only for a
    file that is not byte-level. Remote code (`auto_map`) is not followed."""
    named = (settings.get("tokenizer_class") or model.get("tokenizer_class") or "").removesuffix("Fast")
    if "auto_map" in settings or named not in CLASS_DEFAULTS or model.get("model_type") != "llama":
        return None
    if named == "LlamaTokenizer" and '"ByteLevel"' in path.read_text(encoding="utf-8"):
        return None
    return named


def _class_pipeline(name: str, backend, settings: dict) -> None:
    """The class's own normalizer, pre-tokenizer and decoder, as its __init__ builds them (models/llama/
    tokenization_llama.py, models/gpt2/tokenization_gpt2.py); vocabulary, added tokens and post-processor
    stay the file's."""
    from tokenizers import decoders, pre_tokenizers

    backend.normalizer = None
    if name == "GPT2Tokenizer":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(settings.get("add_prefix_space", False)))
        backend.decoder = decoders.ByteLevel()
        return
    prefix = settings.get("add_prefix_space")
    prefix = True if prefix is None else bool(prefix)
    scheme = ("always" if settings.get("legacy") else "first") if prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if prefix else []))


def _special_tokens(settings: dict, folder: Path, defaults: dict[str, str]) -> dict[str, str]:
    """Every named special token, as transformers collects them: the `*_token` keys of tokenizer_config.json
    (overridden by the legacy special_tokens_map.json where the config has no `added_tokens_decoder`) and
    of a dict `extra_special_tokens`, over the class's defaults; a key set to null names none."""
    named = {**settings, **({} if "added_tokens_decoder" in settings else _json(folder / LEGACY_SPECIAL_FILE))}
    if isinstance(settings.get("extra_special_tokens"), Mapping):  # the dict form names model-specific tokens
        named |= settings["extra_special_tokens"]
    found = {key: _token_text(value) for key, value in named.items()
             if key.endswith("_token") and (value is None or _token_text(value) is not None)}
    return {key: text for key, text in {**defaults, **found}.items() if text is not None}


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or a serialized AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _added_token(tokenizers, entry: Mapping):
    flags = {key: bool(entry[key]) for key in ("single_word", "lstrip", "rstrip", "normalized", "special") if key in entry}
    return tokenizers.AddedToken(entry["content"], **flags)


def _environment():
    """transformers' chat-template environment (utils/chat_template_utils.py), less the assistant-mask tracking:
    its `{% generation %}` tag renders its body."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env


# ----- files ------------------------------------------------------------------------------------------------
def _model(folder: Path) -> dict:
    """config.json's `model_type` and `tokenizer_class`, which decide the tokenizer class as in AutoTokenizer."""
    doc = _json(folder / "config.json")
    return {key: doc[key] for key in ("model_type", "tokenizer_class") if isinstance(doc.get(key), str)}


def _json(path: Path) -> dict:
    """A JSON object file, {} when absent; a one-line error when unreadable."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise InputError(f"'{path}' is not JSON: {err.msg} at line {err.lineno}") from None
    if not isinstance(doc, dict):
        raise InputError(f"'{path}' must hold a JSON object")
    return doc


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"'{path}' cannot be read as UTF-8 text: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:200] or type(err).__name__


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
