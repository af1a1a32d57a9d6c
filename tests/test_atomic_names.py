"""An atomic write's temp file is named after its file but always fits the folder's limit
on a name: a file whose own name nearly fills it (255 bytes) is written all the same."""

from __future__ import annotations

import pytest

from storage.atomic import write_bytes_atomically
from sweep.dispatch import write_module


@pytest.mark.parametrize("name", ["d" * 251 + ".py", "é" * 125 + ".py"],
                         ids=["254 characters", "253 bytes of two-byte characters"])
def test_a_file_whose_name_nearly_fills_name_max_is_written_atomically(tmp_path, name):
    path = tmp_path / name
    write_bytes_atomically(path, b"one")
    assert path.read_bytes() == b"one"
    write_bytes_atomically(path, b"two")  # replaced, through a temp file beside it
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert path.read_bytes() == b"two"


def test_sweep_best_python_writes_a_module_named_with_254_characters(tmp_path):
    path = tmp_path / ("m" * 251 + ".py")
    write_module(path, "# Written by `sweep best --python`\n")
    assert path.read_text().startswith("# Written")
