"""Reading and editing the speculative config in a vLLM container's command and args. Pure: no I/O.

Forms understood (all spellings vLLM's FlexibleArgumentParser accepts, underscores before the first dot included):
- `--speculative-config '<json>'` (two list items) and `--speculative-config=<json>` (one item);
- the dotted form `--speculative-config.num_speculative_tokens 3` / `...=3`: values are JSON when they parse as JSON,
  else strings (what vLLM does), and vLLM replaces the whole `--speculative-config` with the dotted keys, so a mix of
  both forms, a repeated key or the `key+` list-append syntax is refused as ambiguous;
- exec form (`command: ["vllm", "serve", ...]`, `["python3", "-m", "vllm.entrypoints.openai.api_server", ...]`, with
  or without `args`, or `args` alone for the image's `vllm serve` entrypoint) and one shell string
  (`["/bin/sh", "-c", "vllm serve ..."]`), the latter only when it is one simple command that shlex splits exactly
  as the shell would (no `;`, `&&`, `|`, `$`, backticks, redirections, globs; `exec`, quotes and `\\`-newline
  continuations are fine).

`--config file.yaml` (flags from a YAML file, speculative-config possibly among them) is refused: what runs
cannot be read from the args alone.

Every other word is kept byte for byte and in order: in a shell string only the spans of the edited words change.
Failures raise `ArgsError` with an `ActuatorError` reason and a detail that says what to change.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from policies.act.deployment import ActuatorError, EngineFlags, SpeculationSetting

FLAG = "--speculative-config"
CONFIG_FILE_FLAG = "--config"  # vLLM's `--config file.yaml`: flags from a file we cannot read
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
K_KEY = "num_speculative_tokens"
SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_JSON_FORM_HINT = "use `--speculative-config '<json>'` (or `--speculative-config=<json>`) as its own args items"

Form = Literal["absent", "json", "dotted"]
Field = Literal["command", "args"]


class ArgsError(Exception):
    """The args cannot be read or edited safely: `reason` for the metric label, `detail` for people."""

    def __init__(self, reason: ActuatorError, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Word:
    value: str
    field: Field  # which container field holds it (for a shell string: the field holding the script)
    index: int  # index in that field
    span: tuple[int, int] | None = None  # [start, end) in the shell script; None in exec form


@dataclass(frozen=True, slots=True)
class _Located:
    words: list[_Word]  # the vLLM invocation's words, from `vllm`/`python` (or the first arg) to the end
    shell: bool
    script: str | None
    entrypoint: bool = False  # no command: `words` are args to the image's `vllm serve` entrypoint


@dataclass(frozen=True, slots=True)
class VllmCommand:
    """What a container runs: the model (positional after `serve`, or `--model`), the effective speculative config
    (None = speculation off), which form carries it, whether the command is a shell string, and the engine's
    parallelism and scheduler flags (`engine_flags`)."""

    model: str | None
    speculative_config: dict[str, Any] | None
    form: Form
    shell: bool
    engine: EngineFlags = field(default_factory=EngineFlags)


# --------------------------------------------------------------------------------------------------------------
# Shell strings
# --------------------------------------------------------------------------------------------------------------


def _refuse_shell(why: str) -> ArgsError:
    return ArgsError(
        ActuatorError.MALFORMED_ARGS,
        f"the container runs a shell string that cannot be edited safely: {why}; put vLLM's arguments in the exec "
        "form (command: [vllm, serve], args: [...]) or keep the shell string to one simple command, and "
        f"{_JSON_FORM_HINT}",
    )


# Characters that make the shell do more than run one command with literal words, wherever they are unquoted.
_UNSAFE_GROUPS = (
    (";&|", "it has the operator {!r}, so it is more than one simple command"),
    ("<>", "it has a redirection {!r}"),
    ("()", "it has a subshell or function {!r}"),
    ("$`", "it has an expansion {!r}: the value is only known when the shell runs"),
    ("*?[{}", "it has an unquoted {!r}, which the shell may expand"),
)
_UNSAFE = {c: why.format(c) for chars, why in _UNSAFE_GROUPS for c in chars}
# ... and those that do so only at the start of a word.
_UNSAFE_AT_WORD_START = {"#": "it has a comment", "~": "it has an unquoted '~', which the shell expands"}
# The characters a backslash escapes inside double quotes (a `\\`-newline is dropped there too).
_DOUBLE_QUOTE_ESCAPES = '$`"\\\n'


class _ShellLexer:
    """A cursor over one shell script that cuts it into (word, start, end) by the shell's quoting rules: `i` is the
    next character to read, `chars` the word being built (None between words) and `start` where that word began."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.i = 0
        self.chars: list[str] | None = None
        self.start = 0
        self.words: list[tuple[str, int, int]] = []

    def run(self) -> list[tuple[str, int, int]]:
        while self.i < len(self.script):
            _LEXER_HANDLERS.get(self.script[self.i], _ShellLexer.plain)(self)
        self.finish(self.i)
        return self.words

    def begin(self) -> list[str]:
        """The word being built, starting one at `i` if between words."""
        if self.chars is None:
            self.chars, self.start = [], self.i
        return self.chars

    def finish(self, end: int) -> None:
        """End the word being built (if any) at `end`."""
        if self.chars is not None:
            self.words.append(("".join(self.chars), self.start, end))
            self.chars = None

    def backslash(self) -> None:
        """`\\`-newline is a line continuation (the shell drops both characters); `\\c` is a literal c."""
        script, i = self.script, self.i
        if script.startswith("\\\n", i):
            self.i += 2
            return
        if i + 1 >= len(script):
            raise _refuse_shell("it ends with a lone backslash")
        self.begin().append(script[i + 1])
        self.i += 2

    def blank(self) -> None:
        self.finish(self.i)
        self.i += 1

    def newline(self) -> None:
        """A newline ends the command: only blanks may follow."""
        self.finish(self.i)
        if self.script[self.i :].strip():
            raise _refuse_shell("it has several lines, i.e. several commands")
        self.i = len(self.script)

    def single_quote(self) -> None:
        chars = self.begin()
        close = self.script.find("'", self.i + 1)
        if close < 0:
            raise _refuse_shell("a single quote is not closed")
        chars.extend(self.script[self.i + 1 : close])
        self.i = close + 1

    def double_quote(self) -> None:
        """Literal text up to the closing quote, with `\\` escaping only $ ` " \\ and newline; no expansions."""
        chars = self.begin()
        script, n = self.script, len(self.script)
        i = self.i + 1
        while i < n:
            d = script[i]
            if d == '"':
                self.i = i + 1
                return
            if d in "$`":
                raise _refuse_shell(f"it expands {d!r} inside double quotes")
            if d == "\\" and i + 1 < n and script[i + 1] in _DOUBLE_QUOTE_ESCAPES:
                if script[i + 1] != "\n":
                    chars.append(script[i + 1])
                i += 2
                continue
            chars.append(d)
            i += 1
        raise _refuse_shell("a double quote is not closed")

    def plain(self) -> None:
        """An unquoted character: part of the word unless the shell would give it a meaning."""
        c = self.script[self.i]
        why = _UNSAFE.get(c)
        if why is None and self.chars is None:
            why = _UNSAFE_AT_WORD_START.get(c)
        if why is not None:
            raise _refuse_shell(why)
        self.begin().append(c)
        self.i += 1


_LEXER_HANDLERS: dict[str, Callable[[_ShellLexer], None]] = {
    "\\": _ShellLexer.backslash,
    " ": _ShellLexer.blank,
    "\t": _ShellLexer.blank,
    "\n": _ShellLexer.newline,
    "'": _ShellLexer.single_quote,
    '"': _ShellLexer.double_quote,
}


def shell_words(script: str) -> list[tuple[str, int, int]]:
    """Split one simple shell command into (word, start, end) with the shell's quoting rules, refusing anything
    that would make the shell do more than run one command with literal words. Cross-checked against shlex."""
    words = _ShellLexer(script).run()
    if [w for w, _, _ in words] != shlex.split(script.replace("\\\n", ""), posix=True):
        raise _refuse_shell("shlex does not split it the way the shell would")
    return words


# --------------------------------------------------------------------------------------------------------------
# Locating the vLLM invocation
# --------------------------------------------------------------------------------------------------------------


def _invocation_start(values: Sequence[str]) -> int | None:
    """Index of `vllm` (followed by `serve`) or of the python running `-m vllm.entrypoints...`; None if absent."""
    for i, word in enumerate(values):
        base = word.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(values) and values[i + 1] == "serve":
            return i
        module = values[i + 2] if i + 2 < len(values) else ""
        if base.startswith("python") and values[i + 1 : i + 2] == ["-m"] and module.startswith("vllm.entrypoints"):
            return i
    return None


def _is_shell(flat: Sequence[str]) -> bool:
    if len(flat) < 3 or flat[0].rsplit("/", 1)[-1] not in SHELLS:
        return False
    option = flat[1]
    return option.startswith("-") and not option.startswith("--") and "c" in option[1:]


def _locate(command: Sequence[str], args: Sequence[str]) -> _Located:
    flat: list[_Word] = [_Word(v, "command", i) for i, v in enumerate(command)]
    flat += [_Word(v, "args", i) for i, v in enumerate(args)]
    values = [w.value for w in flat]
    if _is_shell(values):
        holder = flat[2]
        script = holder.value
        words = [_Word(v, holder.field, holder.index, (s, e)) for v, s, e in shell_words(script)]
        start = _invocation_start([w.value for w in words])
        if start is None:
            raise ArgsError(
                ActuatorError.MALFORMED_ARGS,
                "the container's shell string does not run `vllm serve` or `python -m vllm.entrypoints...`, so "
                f"its speculative config cannot be found; {_JSON_FORM_HINT}",
            )
        return _Located(words[start:], shell=True, script=script)
    if not command:
        return _Located(flat, shell=False, script=None, entrypoint=True)
    start = _invocation_start(values)
    if start is None:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS,
            f"the container's command {list(command)!r} does not run `vllm serve` or `python -m "
            "vllm.entrypoints.openai.api_server` directly (a wrapper script may ignore edited args); run vLLM "
            "directly, or leave command empty to use the image's entrypoint",
        )
    return _Located(flat[start:], shell=False, script=None)


# --------------------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------------------


def _flag_name(word: str) -> tuple[str, str | None]:
    """(normalised flag before '=', value after '=' or None): vLLM turns '_' into '-' before the first dot."""
    name, eq, value = word.partition("=")
    head, dot, tail = name.partition(".")
    if head.startswith("--"):
        head = "--" + head[2:].replace("_", "-")
    return head + dot + tail, (value if eq else None)


@dataclass(frozen=True, slots=True)
class _SpecArg:
    words: tuple[int, ...]  # indexes into _Located.words (the flag, and its value when separate)
    key: str | None  # dotted key path after `--speculative-config.`; None for the JSON form
    raw: str  # the value text
    flag_text: str  # the flag as written (spelling kept on edit)
    inline: bool  # value after '=' in the same word


def _spec_args(words: Sequence[_Word]) -> list[_SpecArg]:
    found: list[_SpecArg] = []
    i = 0
    while i < len(words):
        name, inline_value = _flag_name(words[i].value)
        if name == CONFIG_FILE_FLAG:
            # vLLM reads every flag, speculative-config included, from this YAML file too; we can neither see
            # what it says nor edit it, so reading the args alone could be wrong and an edit could be overridden.
            raise ArgsError(
                ActuatorError.MALFORMED_ARGS,
                f"{words[i].value.partition('=')[0]} reads flags from a YAML file, which may set speculative-config; "
                "the advisor cannot see or edit it: put the speculative config in the args as "
                "`--speculative-config '<json>'` and drop --config (or keep the file and leave actuation off)",
            )
        if name == FLAG or name.startswith(FLAG + "."):
            flag_text = words[i].value.partition("=")[0]
            key = name[len(FLAG) + 1 :] if name != FLAG else None
            if inline_value is not None:
                found.append(_SpecArg((i,), key, inline_value, flag_text, inline=True))
                i += 1
                continue
            if i + 1 >= len(words):
                raise ArgsError(ActuatorError.MALFORMED_ARGS, f"{flag_text} is the last argument and has no value")
            found.append(_SpecArg((i, i + 1), key, words[i + 1].value, flag_text, inline=False))
            i += 2
            continue
        i += 1
    return found


def _dotted_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # vLLM keeps a value that is not JSON as a string


def _config(found: Sequence[_SpecArg]) -> tuple[dict[str, Any] | None, Form]:
    full = [a for a in found if a.key is None]
    dotted = [a for a in found if a.key is not None]
    if not found:
        return None, "absent"
    if full and dotted:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS,
            "both --speculative-config JSON and dotted --speculative-config.<key> arguments are given (vLLM then "
            f"ignores the JSON entirely); {_JSON_FORM_HINT}, once",
        )
    if len(full) > 1:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS,
            f"--speculative-config is given {len(full)} times (only the last counts); {_JSON_FORM_HINT}, once",
        )
    if full:
        return _json_config(full[0]), "json"
    return _dotted_config(dotted), "dotted"


def _json_config(arg: _SpecArg) -> dict[str, Any]:
    """The config `--speculative-config '<json>'` gives: its value parsed as a JSON object."""
    try:
        parsed = json.loads(arg.raw)
    except json.JSONDecodeError as exc:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS, f"--speculative-config is not valid JSON ({exc}): {arg.raw!r}"
        ) from exc
    if not isinstance(parsed, dict):
        raise ArgsError(ActuatorError.MALFORMED_ARGS, f"--speculative-config is JSON but not an object: {arg.raw!r}")
    return parsed


def _dotted_config(dotted: Sequence[_SpecArg]) -> dict[str, Any]:
    """The config the dotted `--speculative-config.<a>.<b> value` arguments give: nested objects by key path."""
    config: dict[str, Any] = {}
    seen: set[str] = set()
    for arg in dotted:
        assert arg.key is not None
        if arg.key.endswith("+") or not all(arg.key.split(".")):
            raise ArgsError(
                ActuatorError.MALFORMED_ARGS,
                f"{arg.flag_text} uses a dotted key form the advisor does not edit (list append or empty key); "
                f"{_JSON_FORM_HINT}",
            )
        if arg.key in seen:
            raise ArgsError(ActuatorError.MALFORMED_ARGS, f"{arg.flag_text} is given twice; give each key once")
        seen.add(arg.key)
        *parents, leaf = arg.key.split(".")
        node = config
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ArgsError(ActuatorError.MALFORMED_ARGS, f"{arg.flag_text} conflicts with another dotted key")
            node = child
        node[leaf] = _dotted_value(arg.raw)
    return config


def _model(located: _Located) -> str | None:
    values = [w.value for w in located.words]
    for i, value in enumerate(values):
        name, inline = _flag_name(value)
        if name == "--model":
            return inline if inline is not None else (values[i + 1] if i + 1 < len(values) else None)
    at = _model_at(located)
    return values[at] if at is not None else None


def _model_at(located: _Located) -> int | None:
    """Index in `located.words` of `vllm serve`'s positional model_tag (None when there is none)."""
    values = [w.value for w in located.words]
    after = 0 if located.entrypoint else (2 if values[1:2] == ["serve"] else len(values))
    return after if after < len(values) and not values[after].startswith("-") else None


def read_vllm_command(
    command: Sequence[str], args: Sequence[str], env: Mapping[str, str] | None = None
) -> VllmCommand:
    """The model and the effective speculative config a container's command + args give vLLM, and its engine flags
    (`engine_flags`, with `$(NAME)` expanded from `env`, the container's literal env values).

    Example: command ["vllm", "serve"], args ["m", "--speculative-config", '{"method": "ngram",
    "num_speculative_tokens": 3}'] -> VllmCommand(model="m", speculative_config={"method": "ngram",
    "num_speculative_tokens": 3}, form="json", shell=False).
    """
    located = _locate(command, args)
    config, form = _config(_spec_args(located.words))
    return VllmCommand(model=_model(located), speculative_config=config, form=form, shell=located.shell,
                       engine=engine_flags([w.value for w in located.words], env, model_at=_model_at(located)))


# vLLM's spellings of the flags `EngineFlags` reads (after `_flag_name`'s normalisation), by field, and whether the
# value may carry vLLM's human-readable suffixes (its `human_readable_int`, for --max-num-batched-tokens only:
# 8k = 8000, 8K = 8192).
_ENGINE_FLAGS: Mapping[str, tuple[str, bool]] = {
    "--tensor-parallel-size": ("tensor_parallel_size", False),
    "-tp": ("tensor_parallel_size", False),
    "--pipeline-parallel-size": ("pipeline_parallel_size", False),
    "-pp": ("pipeline_parallel_size", False),
    "--max-num-seqs": ("max_num_seqs", False),
    "--max-num-batched-tokens": ("max_num_batched_tokens", True),
}
_PLAIN_INT = re.compile(r"\+?(\d+)")
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _flag_int(text: str, *, human: bool) -> int | None:
    """`text` as vLLM's parser reads it: an integer (argparse's int: surrounding blanks and a '+' allowed), or with
    `human` a number with vLLM's suffix (lowercase decimal, uppercase binary; decimals only with a decimal suffix).
    None when it is none of these or below 1. Example: "16K" -> 16384, "25.6k" -> 25600, "8.5K" -> None."""
    text = text.strip()
    plain = _PLAIN_INT.fullmatch(text)
    if plain is not None:
        value = int(plain.group(1))
        return value if value >= 1 else None
    found = _HUMAN_INT.fullmatch(text) if human else None
    if found is None or not found.group(2):
        return None
    number, suffix = found.groups()
    if suffix in _DECIMAL:
        value = int(float(number) * _DECIMAL[suffix])
    elif "." in number:
        return None
    else:
        value = int(number) * _BINARY[suffix]
    return value if value >= 1 else None


def _engine_flag(name: str) -> tuple[str, bool] | None:
    """The `_ENGINE_FLAGS` entry `name` spells, also as an abbreviation argparse accepts (a prefix of exactly one of
    the long flags, or of the short ones -tp/-pp: were it a prefix of another vLLM option too, vLLM would refuse to
    start, and nothing runs to mistake). Example: "--tensor-parallel" -> ("tensor_parallel_size", False); "-t" ->
    the same; "--max-num" (two of them) -> None."""
    known = _ENGINE_FLAGS.get(name)
    if known is not None or not name.startswith("-") or len(name) < 2 or "." in name:
        return known
    double = name.startswith("--")
    matches = {entry for flag, entry in _ENGINE_FLAGS.items()
               if flag.startswith("--") == double and flag.startswith(name)}
    return matches.pop() if len(matches) == 1 else None


def _expanded(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of `$(NAME)` in a container's command and args from its env (a reference to a name not
    in `env`, or whose value is not a literal, stays as written; `$$` escapes a `$`)."""
    parts = text.split("$$")
    return "$".join(_ENV_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), part) for part in parts)


def engine_flags(
    words: Sequence[str], env: Mapping[str, str] | None = None, *, model_at: int | None = None
) -> EngineFlags:
    """The parallelism and scheduler flags in a vLLM invocation's `words`, each as `--flag N` or `--flag=N`
    (underscores and argparse's abbreviations accepted, as vLLM's parser does; the last of a repeated flag wins, as
    argparse's does), after `$(NAME)` is expanded from `env` (the container's literal env values) as Kubernetes does.
    A value that cannot be read is kept in `unreadable` rather than taken as absent: what runs is then unknown, not
    vLLM's default. So is the parallelism when a reference left unexpanded stands where flags could (not at
    `model_at`, the positional model's index, nor right after a flag that takes it as its value): it may hold
    `--tensor-parallel-size=8` or `-pp=2`.

    Example: ["vllm", "serve", "m", "-tp", "$(TP)", "--max_num_batched_tokens=16K"] with env {"TP": "2"} ->
    EngineFlags(tensor_parallel_size=2, max_num_batched_tokens=16384).
    """
    expanded = [_expanded(word, env or {}) for word in words]
    found: dict[str, int | None] = {}
    unreadable: dict[str, str] = {}
    skip = -1
    for i, word in enumerate(expanded):
        if i == skip:
            continue
        name, inline = _flag_name(word)
        known = _engine_flag(name)
        if known is None:
            if _ENV_REFERENCE.search(word) and i != model_at and not _takes_value(expanded[i - 1] if i else ""):
                for attribute in ("tensor_parallel_size", "pipeline_parallel_size"):
                    found[attribute] = None
                    unreadable[attribute] = word
            continue
        attribute, human = known
        raw = inline if inline is not None else (expanded[i + 1] if i + 1 < len(expanded) else "")
        skip = i + 1 if inline is None else skip
        value = _flag_int(raw, human=human)
        found[attribute] = value
        if value is None:
            unreadable[attribute] = raw
        else:
            unreadable.pop(attribute, None)
    return EngineFlags(**found, unreadable=tuple(sorted(unreadable.items())))


def _takes_value(word: str) -> bool:
    """Whether `word` is an option that would take the next word as its value (a flag without '=')."""
    return word.startswith("-") and "=" not in word and len(word) > 1


# --------------------------------------------------------------------------------------------------------------
# Settings <-> config
# --------------------------------------------------------------------------------------------------------------


def setting_from_config(config: Mapping[str, Any] | None) -> SpeculationSetting:
    """The setting a speculative config runs: off for None; `num_speculative_tokens` and, when present, the Dynamic
    SD bands [[start_bs, end_bs, K], ...] as ascending (end_bs, K) pairs.

    Example: {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 512, 0]]} ->
    SpeculationSetting(3, schedule=((64, 3), (512, 0))).
    """
    if config is None:
        return SpeculationSetting(0)
    k = config.get(K_KEY)
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS,
            f"the speculative config has no non-negative integer {K_KEY} ({k!r}); set it explicitly so the advisor "
            "can read and change it",
        )
    bands = config.get(SCHEDULE_KEY)
    if bands is None:
        return SpeculationSetting(k)
    schedule: list[tuple[int, int, int]] = []
    if isinstance(bands, list):
        for band in bands:
            if (
                isinstance(band, list)
                and len(band) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in band)
            ):
                schedule.append((band[0], band[1], band[2]))
    if not isinstance(bands, list) or len(schedule) != len(bands) or not schedule:
        raise ArgsError(
            ActuatorError.MALFORMED_ARGS,
            f"{SCHEDULE_KEY} is not a list of [start_bs, end_bs, K] integer triples: {bands!r}",
        )
    schedule.sort()
    return SpeculationSetting(k, schedule=tuple((hi, band_k) for _, hi, band_k in schedule))


def vllm_bands(schedule: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Ascending (max batch size, K) pairs as Dynamic SD's inclusive [start_bs, end_bs, K] bands from batch 1.

    Example: ((8, 3), (32, 1), (256, 0)) -> [[1, 8, 3], [9, 32, 1], [33, 256, 0]].
    """
    bands: list[list[int]] = []
    low = 1
    for high, k in schedule:
        if high < low or k < 0:
            raise ArgsError(ActuatorError.UNEXPECTED, f"schedule bands are not ascending non-empty: {schedule!r}")
        bands.append([low, high, k])
        low = high + 1
    return bands


def config_for(base: Mapping[str, Any], desired: SpeculationSetting, *, schedule: bool) -> dict[str, Any]:
    """`base` (a full speculative config: method, model, ...) set to run `desired`: with `schedule`, Dynamic SD
    bands and `num_speculative_tokens` = their largest K; else a fixed K with any bands removed. Key order kept.

    Example: base {"method": "eagle", "num_speculative_tokens": 3}, desired SpeculationSetting(2, schedule=((64, 3),
    (512, 0))), schedule=True -> {"method": "eagle", "num_speculative_tokens": 3,
    "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 512, 0]]} (max K of the bands is 3).
    """
    config = dict(base)
    if schedule and desired.schedule:
        bands = vllm_bands(desired.schedule)
        config[K_KEY] = max(k for _, _, k in bands)
        config[SCHEDULE_KEY] = bands
    else:
        config[K_KEY] = desired.num_speculative_tokens
        config.pop(SCHEDULE_KEY, None)
    return config


# --------------------------------------------------------------------------------------------------------------
# Editing
# --------------------------------------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value)


def _dotted_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class _Edit:
    """Replace words[first..last] (inclusive; first > last = insert after `last`) with `new` words."""

    first: int
    last: int
    new: tuple[str, ...]


def _edits(located: _Located, found: Sequence[_SpecArg], old: dict[str, Any] | None,
           config: Mapping[str, Any] | None) -> list[_Edit]:
    if config is None:
        return [_Edit(a.words[0], a.words[-1], ()) for a in found]
    text = _dumps(config)
    full = [a for a in found if a.key is None]
    dotted = [a for a in found if a.key is not None]
    if full:
        (arg,) = full
        if arg.inline:
            return [_Edit(arg.words[0], arg.words[0], (f"{arg.flag_text}={text}",))]
        return [_Edit(arg.words[1], arg.words[1], (text,))]
    if not dotted:
        end = len(located.words) - 1
        return [_Edit(end + 1, end, (FLAG, text))]
    assert old is not None
    return _dotted_edits(dotted, old, config)


def _dotted_edits(dotted: Sequence[_SpecArg], old: Mapping[str, Any], config: Mapping[str, Any]) -> list[_Edit]:
    """Dotted form: change only the top-level keys that differ, each in its own word, keeping the user's form."""
    changed = {k for k in set(old) | set(config) if old.get(k) != config.get(k) or (k in old) != (k in config)}
    by_key = {a.key: a for a in dotted}
    edits: list[_Edit] = []
    for key in sorted(changed):
        known = by_key.get(key)
        nested = [a for a in dotted if a.key is not None and a.key.startswith(key + ".")]
        if nested or (known is None and key in old):
            raise ArgsError(
                ActuatorError.MALFORMED_ARGS,
                f"the dotted --speculative-config.{key} arguments cannot be changed one key at a time; "
                f"{_JSON_FORM_HINT}",
            )
        edits.append(_dotted_key_edit(key, known, dotted[-1], config))
    return edits


def _dotted_key_edit(key: str, known: _SpecArg | None, last: _SpecArg, config: Mapping[str, Any]) -> _Edit:
    """The edit setting top-level `key` to `config[key]`: drop its argument when `config` has no such key, append a
    new one after `last` (the last dotted argument, in its inline-or-not form) when there is none (`known` None),
    else replace its value."""
    if key not in config:
        assert known is not None
        return _Edit(known.words[0], known.words[-1], ())
    text = _dotted_text(config[key])
    if known is None:
        prefix = last.flag_text.split(".", 1)[0]
        new = (f"{prefix}.{key}={text}",) if last.inline else (f"{prefix}.{key}", text)
        return _Edit(last.words[-1] + 1, last.words[-1], new)
    if known.inline:
        return _Edit(known.words[0], known.words[0], (f"{known.flag_text}={text}",))
    return _Edit(known.words[1], known.words[1], (text,))


def _apply_exec(located: _Located, edits: Sequence[_Edit], command: Sequence[str],
                args: Sequence[str]) -> tuple[list[str], list[str]]:
    fields: dict[Field, list[str | None]] = {"command": list(command), "args": list(args)}
    appended: list[str] = []
    inserts: dict[tuple[Field, int], list[str]] = {}
    for edit in edits:
        if edit.first > edit.last:  # insert after word `last`
            if edit.last + 1 >= len(located.words):
                appended.extend(edit.new)
                continue
            after = located.words[edit.last]
            inserts.setdefault((after.field, after.index), []).extend(edit.new)
            continue
        targets = located.words[edit.first : edit.last + 1]
        for n, word in enumerate(targets):
            fields[word.field][word.index] = None
            if n == 0 and edit.new:
                inserts.setdefault((word.field, word.index - 1), []).extend(edit.new)
    out: dict[Field, list[str]] = {}
    for name, values in fields.items():
        result: list[str] = list(inserts.get((name, -1), []))
        for i, value in enumerate(values):
            if value is not None:
                result.append(value)
            result.extend(inserts.get((name, i), []))
        out[name] = result
    out["args"].extend(appended)  # Kubernetes runs command + args: appending to args appends to the argv
    return out["command"], out["args"]


def _apply_shell(located: _Located, edits: Sequence[_Edit]) -> str:
    script = located.script
    assert script is not None
    spans = [w.span for w in located.words]
    pieces: list[tuple[int, int, str]] = []  # [start, end) of the script replaced by text
    for edit in edits:
        quoted = " ".join(shlex.quote(v) for v in edit.new)
        if edit.first > edit.last:
            span = spans[edit.last]
            assert span is not None
            pieces.append((span[1], span[1], " " + quoted))
            continue
        first, last = spans[edit.first], spans[edit.last]
        assert first is not None and last is not None
        if edit.new:
            pieces.append((first[0], last[1], quoted))
        else:  # drop the words and the blank (or continuation) before them
            previous = spans[edit.first - 1] if edit.first > 0 else None
            pieces.append((previous[1] if previous is not None else first[0], last[1], ""))
    out = script
    for start, end, text in sorted(pieces, reverse=True):
        out = out[:start] + text + out[end:]
    return out


def with_speculative_config(
    command: Sequence[str], args: Sequence[str], config: Mapping[str, Any] | None
) -> tuple[list[str], list[str]]:
    """The container's (command, args) running `config` as the speculative config (None: no speculative config,
    i.e. speculation off). The existing form and spelling are kept; a new config is appended as
    `--speculative-config <json>`. Every other word is unchanged and in order.

    Example: command [], args ["m", "--port", "8000", "--speculative-config={\\"num_speculative_tokens\\": 3}"],
    config None -> ([], ["m", "--port", "8000"]).
    """
    located = _locate(command, args)
    found = _spec_args(located.words)
    old, _ = _config(found)
    edits = _edits(located, found, old, config)
    if located.shell:
        holder = located.words[0] if located.words else None
        assert holder is not None
        new_command, new_args = list(command), list(args)
        target = new_command if holder.field == "command" else new_args
        target[holder.index] = _apply_shell(located, edits)
        result = (new_command, new_args)
    else:
        result = _apply_exec(located, edits, command, args)
    after = read_vllm_command(*result)
    if after.speculative_config != (dict(config) if config is not None else None):
        raise ArgsError(ActuatorError.UNEXPECTED, "the edited args do not read back as the intended config")
    return result


# --------------------------------------------------------------------------------------------------------------
# Which container
# --------------------------------------------------------------------------------------------------------------


def _runs_vllm(container: Mapping[str, Any]) -> bool:
    command = [str(v) for v in container.get("command") or []]
    args = [str(v) for v in container.get("args") or []]
    flat = command + args
    if _is_shell(flat):
        try:
            return _invocation_start([w for w, _, _ in shell_words(flat[2])]) is not None
        except ArgsError:
            return "vllm" in flat[2]
    if _invocation_start(flat) is not None:
        return True
    return not command and "vllm" in str(container.get("image", ""))  # the image's entrypoint is vLLM


def select_vllm_container(containers: Sequence[Mapping[str, Any]], name: str | None) -> Mapping[str, Any]:
    """The vLLM container: the one named `name`; else the only container; else the only one that runs vLLM (its
    command/args invoke `vllm serve` or `python -m vllm.entrypoints...`, or it uses a vLLM image's entrypoint).

    Example: containers [{"name": "vllm", "command": ["vllm", "serve"]}, {"name": "spec-advisor"}], name None ->
    the "vllm" container.
    """
    if name is not None:
        named = [c for c in containers if c.get("name") == name]
        if not named:
            present = [c.get("name") for c in containers]
            raise ArgsError(
                ActuatorError.NO_VLLM_CONTAINER, f"the pod template has no container {name!r} (it has {present!r})"
            )
        return named[0]
    if len(containers) == 1:
        return containers[0]
    running = [c for c in containers if _runs_vllm(c)]
    if len(running) == 1:
        return running[0]
    names = [c.get("name") for c in containers]
    why = "none of them runs vLLM" if not running else f"{len(running)} of them run vLLM"
    raise ArgsError(
        ActuatorError.NO_VLLM_CONTAINER,
        f"cannot tell which of the containers {names!r} is vLLM ({why}); name it in the actuator's settings",
    )
