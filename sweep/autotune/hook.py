"""The one place this project reaches into Triton's autotuner: a wrapper around
`Autotuner.run`, installed once per process, that hands each call to the listeners
installed (the capture's recorder, the loader of a run's answers).

Also Triton's own rules this project must agree with, each written once: the name a
kernel is imported by, its tuning key, and a config's canonical form.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

from storage.capture import config_form as capture_form

Proceed = Callable[[], Any]


class Listener(Protocol):
    def around(self, tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               proceed: Proceed) -> Any:
        """Run the call (proceed()) and return its result, doing what it does around it."""
        ...


_listeners: list[Listener] = []
_original: Callable[..., Any] | None = None


def install(listener: Listener) -> None:
    """Wrap Autotuner.run (once) and hand every later call to listener too."""
    global _original
    from triton.runtime.autotuner import Autotuner

    if _original is None:
        _original = Autotuner.run
        original = _original

        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            def call(i: int) -> Any:
                if i == len(_listeners):
                    return original(self, *args, **kwargs)
                return _listeners[i].around(self, args, kwargs, lambda: call(i + 1))

            return call(0)

        setattr(run, "__wrapped__", original)  # noqa: B010 (a function has no such slot)
        Autotuner.run = run
    if listener not in _listeners:
        _listeners.append(listener)


def uninstall(listener: Listener) -> None:
    """Stop handing calls to listener; the last one gone puts Triton's run back."""
    global _original
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners and _original is not None:
        from triton.runtime.autotuner import Autotuner

        Autotuner.run = _original
        _original = None


def base_function(tuner: Any) -> Any:
    """The Python function under the autotuner (and any heuristics, and the JIT)."""
    fn = tuner.fn
    while hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def kernel_name(tuner: Any) -> str | None:
    """"module:attr" that imports this autotuner: the attribute of its function's module
    that holds it, or holds a layer over it (a `@triton.heuristics` outside the
    autotune). None where none does (made in a function, held in a dict): a worker could
    not import it."""
    module_name = getattr(base_function(tuner), "__module__", None)
    module = sys.modules.get(module_name or "")
    if module is None or module_name == "__main__":
        return None
    for attr, value in vars(module).items():
        layer = value
        for _ in range(8):  # decorators are few; a cycle of .fn must not hang the program
            if layer is tuner:
                return f"{module_name}:{attr}"
            layer = getattr(layer, "fn", None)
            if layer is None:
                break
    return None


def tuning_key(tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Triton's tuning key for a call (Autotuner.run, triton 3.4 to 3.9): the values of
    the key arguments passed, then str(dtype) of every argument with a dtype, positional
    ones first, then keywords in call order (grid and warmup are not arguments)."""
    passed = {**dict(zip(tuner.arg_names, args)), **kwargs}
    passed = {k: v for k, v in passed.items() if k in tuner.arg_names}
    key = [passed[k] for k in tuner.keys if k in passed]
    key += [str(v.dtype) for v in passed.values() if hasattr(v, "dtype")]
    return tuple(key)


def config_form(config: Any) -> str:
    """A triton.Config (or a spec's config mapping) as canonical text: what matches a
    tuned config to the live one in a kernel's list."""
    if hasattr(config, "all_kwargs"):
        return capture_form({k: v for k, v in config.all_kwargs().items()
                             if k != "ir_override"})
    return capture_form(config)
