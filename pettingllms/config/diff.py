"""Which keys differ between two configs, as dotted keys (the names an override uses): a resumed run names what it
changed from its checkpoint's config."""

from __future__ import annotations

from typing import Any, Mapping

ABSENT = "(absent)"  # the side of a change where the key does not exist


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` -> ``{"optim.lr": 0.1}``. Lists and empty sections are values of their own key."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every key whose value differs, sorted by key; ``ABSENT`` on the side
    that lacks the key."""
    before, after = flatten(old), flatten(new)
    keys = before.keys() | after.keys()
    changes = [(key, before.get(key, ABSENT), after.get(key, ABSENT)) for key in sorted(keys)
               if before.get(key, ABSENT) != after.get(key, ABSENT)]
    # an empty section that gained (or lost) keys is named by those keys, not also as `{} -> (absent)`
    return [c for c in changes if not (ABSENT in c[1:] and {} in c[1:] and any(k.startswith(c[0] + ".") for k in keys))]


def describe_changes(changes: list[tuple[str, Any, Any]]) -> str:
    """``optim.lr: 0.001 -> 0.002, training.resume: 'none' -> 'auto'``."""
    return ", ".join(f"{key}: {_show(old)} -> {_show(new)}" for key, old, new in changes)


def _show(value: Any) -> str:
    return value if value is ABSENT else repr(value) if isinstance(value, str) else str(value)
