"""Every field of ``Sample`` is used: something in the library sets it or reads it, so no field is dead weight
carried (and saved) with every sample."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pettingllms
from pettingllms.core.types import Sample

LIBRARY = Path(pettingllms.__file__).parent


def test_every_sample_field_is_set_or_read_outside_its_definition():
    sources = "\n".join(p.read_text() for p in LIBRARY.rglob("*.py") if p != LIBRARY / "core" / "types.py")
    unused = [f.name for f in dataclasses.fields(Sample)
              if not re.search(rf"(\.{f.name}\b|\b{f.name}=|[\"']{f.name}[\"'])", sources)]
    assert unused == []
