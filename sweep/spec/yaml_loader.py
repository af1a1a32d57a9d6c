"""Reading a spec file's bytes and YAML with every size, nesting and type bounded: no input
can make loading, or the one-line error it ends in, huge or slow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sweep.spec.constraints import clip_repr, clip_text
from sweep.spec.model import INT64_MAX, INT64_MIN, MAX_NESTING, MAX_SPEC_BYTES, SpecError


class _Refused(yaml.MarkedYAMLError):
    """YAML that parses but that a spec does not allow; the message names its line."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


_STR_TAG = "tag:yaml.org,2002:str"


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader for a spec. Refuses aliases (nested ones expand exponentially: a few
    hundred bytes can become gigabytes), deep nesting, mapping keys that are not strings,
    a key given twice in one mapping (the last would win), integers beyond int64 and lone
    surrogates (neither survives numpy, JSON or UTF-8 later)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _Refused("YAML aliases are not supported in a spec",
                           self.peek_event().start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise _Refused(f"nested more than {MAX_NESTING} levels deep",
                               self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
            # PyYAML's own constructors raise these for explicitly tagged values they
            # cannot read, such as `!!int abc` or `!!bool ''`.
            kind = str(node.tag).rpartition(":")[2]
            raise _Refused(f"cannot read {clip_repr(node.value, 40)} as {kind} "
                           f"({type(e).__name__})", node.start_mark) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(f"mapping keys must be strings, got a "
                               f"{type(key_node).__name__[:-4].lower()}", key_node.start_mark)
            if key_node.tag != _STR_TAG:
                kind = key_node.tag.rpartition(":")[2]
                text = clip_text(key_node.value, 40)
                raise _Refused(f"mapping keys must be strings; YAML reads {text} as {kind}, "
                               f"not a string (quote it: '{text}')", key_node.start_mark)
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {clip_repr(key_node.value)} given twice",
                    key_node.start_mark)
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)

    def construct_int64(self, node: Any) -> int:
        # Checked before int() runs: a long digit string is slow to convert, and beyond
        # 4300 digits Python refuses it with a ValueError.
        text = node.value.replace("_", "") if isinstance(node.value, str) else ""
        value = self.construct_yaml_int(node) if len(text) <= 70 else None
        if value is None or not INT64_MIN <= value <= INT64_MAX:
            raise _Refused(f"the integer {clip_text(text, 40)} does not fit in 64 bits "
                           "(from -2**63 to 2**63 - 1)", node.start_mark)
        return value

    def construct_unicode(self, node: Any) -> str:
        value = self.construct_yaml_str(node)
        try:
            value.encode()
        except UnicodeEncodeError:
            raise _Refused(f"the string {clip_repr(value)} holds a lone surrogate; a spec "
                           "must be valid Unicode", node.start_mark) from None
        return value


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_int64)
_SpecLoader.add_constructor(_STR_TAG, _SpecLoader.construct_unicode)


def read_text(path: Path, source: Path) -> str:
    try:
        with source.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than 1 MiB ({MAX_SPEC_BYTES:,} bytes), the most a "
                        "spec may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SpecError(f"{path}: not UTF-8 text ({e.reason}: byte 0x{data[e.start]:02x} on "
                        f"line {line}); save the file as UTF-8") from None


def parse_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_SpecLoader)
    except _Refused as e:
        raise SpecError(f"{path}: line {e.problem_mark.line + 1}: {e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}: {where}: invalid YAML ({clip_text(problem, 200)})") from None
    except (RecursionError, MemoryError) as e:  # bounded above; kept as a last resort
        raise SpecError(f"{path}: YAML too complex to load ({type(e).__name__})") from None


def read_spec_text(path: str | Path, cwd: Path | None = None) -> str:
    """A spec file's text, to load it from more than once (a pipe, `<(...)`, reads once)."""
    path = Path(path)
    return read_text(path, cwd / path if cwd is not None else path)

