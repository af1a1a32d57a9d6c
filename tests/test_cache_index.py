"""The best-config cache is an index: a launch-time lookup reads only the entries that could
answer it (its kernel's, of its source, device, versions and fixed arguments), however many
other kernels have; entries an earlier version wrote flat are still read, and moved by the
next write. Counted in files read, not seconds."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import storage.atomic
import storage.cache
import storage.durable
from storage.cache import CacheEntry, cache_dir, library_versions, of_kernel, store
from sweep.tuned import tuned_config, tuned_entry

ASKED = {"rows": 4, "cols": 512, "dtype": "float32"}


def softmax_source() -> str:
    from sweep_kernels import load_kernel, source_digest

    return source_digest("softmax", load_kernel("softmax"))


def entry(cols: int, *, kernel: str = "softmax", block: int = 32) -> CacheEntry:
    """An interpreter entry of kernel for this many columns, as a sweep of it leaves."""
    return CacheEntry(kernel=kernel, kernel_source=softmax_source(),
                      problem={"rows": 4, "cols": cols, "dtype": "float32"},
                      backend="interpret", device="cpu-interpreter",
                      config={"BLOCK_N": block}, latency_ms=1.0, fingerprint="f",
                      run_dir="/runs/x", partial=False, written_at=time.time(),
                      versions=library_versions())


@pytest.fixture
def files_read(monkeypatch) -> list[Path]:
    """Every cache file read whole (opened and parsed), from now on."""
    read: list[Path] = []
    real = storage.cache.read_json

    def counted(path: Path, *args: object) -> object:
        doc = real(path, *args)
        read.append(Path(path))
        return doc

    monkeypatch.setattr(storage.cache, "read_json", counted)
    return read


def test_a_launch_of_an_untuned_size_reads_only_its_groups_entries(files_read):
    for cols in range(1, 61):  # another kernel's entries, 60 of them
        store(entry(cols, kernel="other"))
    for cols, block in ((64, 32), (1024, 256), (8192, 512)):
        store(entry(cols, block=block))
    files_read.clear()
    assert tuned_config("softmax", ASKED, device="cpu-interpreter") == {"BLOCK_N": 256}
    assert len(files_read) == 3  # the three softmax entries, nothing of the other kernel
    assert {p.parent for p in files_read} == {entry(64).path().parent}
    # A write to another kernel's entries costs the next launch nothing.
    store(entry(61, kernel="other"))
    files_read.clear()
    assert tuned_config("softmax", ASKED, device="cpu-interpreter") == {"BLOCK_N": 256}
    assert files_read == []
    # One to this kernel's group is looked at: a nearer size now answers.
    store(entry(600, block=128))
    assert tuned_config("softmax", ASKED, device="cpu-interpreter") == {"BLOCK_N": 128}


def test_an_exact_lookup_reads_one_file(files_read):
    for cols in range(1, 41):
        store(entry(cols, kernel="other"))
    store(entry(512, block=64))
    files_read.clear()
    assert tuned_config("softmax", ASKED, device="cpu-interpreter") == {"BLOCK_N": 64}
    assert files_read == [entry(512).path()]


def test_entries_written_flat_by_an_earlier_version_answer_and_move_on_the_next_write():
    root = cache_dir()
    root.mkdir(parents=True)
    for cols, block in ((64, 32), (512, 64)):
        flat = entry(cols, block=block)
        (root / f"{flat.key}.json").write_text(json.dumps(asdict(flat)))
    assert tuned_config("softmax", ASKED, device="cpu-interpreter") == {"BLOCK_N": 64}
    assert tuned_entry("softmax", {**ASKED, "cols": 128}, "cpu-interpreter").distance == 1.0
    assert len(of_kernel("softmax")) == 2
    store(entry(7, kernel="other"))  # any write moves them into their folders
    assert list(root.glob("*.json")) == []
    assert sorted(p.name for p in root.rglob("*.json")) == sorted(
        f"{e.key}.json" for e in (entry(64), entry(512), entry(7, kernel="other")))
    assert [dict(e.config) for e in of_kernel("softmax")] in (
        [{"BLOCK_N": 32}, {"BLOCK_N": 64}], [{"BLOCK_N": 64}, {"BLOCK_N": 32}])


def test_a_flat_entry_worse_than_its_moved_copy_is_dropped_not_kept():
    root = cache_dir()
    store(entry(512, block=64))
    slower = replace(entry(512, block=16), latency_ms=5.0)
    (root / f"{slower.key}.json").write_text(json.dumps(asdict(slower)))
    store(entry(7, kernel="other"))
    assert list(root.glob("*.json")) == []
    assert tuned_config("softmax", ASKED, device="cpu-interpreter") == {"BLOCK_N": 64}


@pytest.mark.parametrize("value", [10**400, float("nan"), float("inf"), "tensor", [512],
                                   None], ids=repr)
def test_launch_code_asking_with_an_odd_value_gets_its_default(value):
    """A value no spec could hold is no size to measure a distance from: the default
    (or None), never an exception in launch code."""
    store(entry(2**20, block=64))
    if value == "tensor":
        import torch

        value = torch.tensor(512)
    problem = {**ASKED, "cols": value}
    assert tuned_config("softmax", problem, default={"BLOCK_N": 8},
                        device="cpu-interpreter") == {"BLOCK_N": 8}
    assert tuned_config("softmax", problem, device="cpu-interpreter") is None


def test_a_size_far_below_the_tuned_one_is_answered_from_it():
    store(entry(2**20, block=64))
    found = tuned_entry("softmax", {**ASKED, "cols": 1e-320}, "cpu-interpreter")
    assert found is not None and dict(found.config) == {"BLOCK_N": 64}
    assert 1080 < found.distance < 1085  # log2(2**20) + 1063.1


def test_the_dispatch_modules_lookup_is_a_dict_for_a_tuned_problem_and_remembered_else(
        tmp_path):
    import importlib.util

    from sweep.dispatch import Table, Tuned, module_text

    table = Table(kernel="k", name="n", run_dir="/r", fingerprint="f", started_at=0.0,
                  partial=False, defaults={"dtype": "float16"}, launch_options=("num_warps",),
                  problems=[Tuned({"M": m, "dtype": "float16"}, {"BLOCK": m % 7 + 1}, "GPU",
                                  1.0, i) for i, m in enumerate(range(16, 16 + 2000))])
    path = tmp_path / "k.py"
    path.write_text(module_text(table))
    spec = importlib.util.spec_from_file_location("dispatch_index", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    compared = []
    real = module._alike
    module._alike = lambda a, b: compared.append(b) or real(a, b)
    assert module.config_for({"M": 1000}) == {"BLOCK": 1000 % 7 + 1}
    assert module.config_for({"M": 1000.0, "dtype": "float16"}) == {"BLOCK": 1000 % 7 + 1}
    assert compared == []  # no row compared: a dict's lookup
    assert module.config_for({"M": 4096}) == {"BLOCK": 2015 % 7 + 1}  # the largest tuned
    assert len(compared) == 2000  # an untuned size compares each row once
    assert module.config_for({"M": 4096}) == {"BLOCK": 2015 % 7 + 1}
    assert len(compared) == 2000  # and then is remembered
    assert module.config_for({"M": 1e-320}) == {"BLOCK": 16 % 7 + 1}  # the smallest
    assert module.config_for({"M": [16]}) is None  # no tuned problem is alike


class Tensorish(int):
    """A size that hashes by its identity, as a torch.Tensor does."""

    __hash__ = object.__hash__


def test_the_dispatch_modules_memo_keeps_no_identity_hashed_value_and_stays_under_its_cap(
        tmp_path):
    import importlib.util

    from sweep.dispatch import Table, Tuned, module_text

    table = Table(kernel="k", name="n", run_dir="/r", fingerprint="f", started_at=0.0,
                  partial=False, defaults={}, launch_options=(),
                  problems=[Tuned({"M": m}, {"BLOCK": m}, "GPU", 1.0, i)
                            for i, m in enumerate((16, 64))])
    path = tmp_path / "k.py"
    path.write_text(module_text(table))
    spec = importlib.util.spec_from_file_location("dispatch_memo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for _ in range(3):
        assert module.config_for({"M": Tensorish(60)}) == {"BLOCK": 64}
    assert module._ANSWERS == {}  # each would be a new key, kept for ever
    for m in range(1, 3 * module.MEMO_CAP):
        module.config_for({"M": m})
        assert len(module._ANSWERS) <= module.MEMO_CAP
    assert module.config_for({"M": 17}) == {"BLOCK": 16}  # and it still answers


def test_sweep_best_names_an_entrys_file_where_it_is():
    from sweep.best import _where

    flat = entry(64)
    root = cache_dir()
    root.mkdir(parents=True)
    (root / f"{flat.key}.json").write_text(json.dumps(asdict(flat)))
    assert _where(flat) == root / f"{flat.key}.json"
    store(entry(7, kernel="other"))  # moves it
    assert _where(flat) == flat.path() and flat.path().is_file()


def test_a_run_over_many_problems_makes_its_entries_durable_at_once(monkeypatch):
    """One syncfs of the cache's filesystem for a batch of entries, not two fsyncs an
    entry (what a run over 10,000 problems spent most of a minute on) nor an os.sync() of
    every filesystem. Each entry still lands whole and readable."""
    syncs: list[object] = []
    real_fsync = storage.atomic.os.fsync
    monkeypatch.setattr(storage.atomic.os, "fsync",
                        lambda fd: (syncs.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(storage.cache.os, "sync", lambda: syncs.append("sync"))
    real_syncfs = storage.durable._libc_syncfs()
    assert real_syncfs is not None  # Linux's libc has it

    def counted(fd: int) -> int:
        syncs.append(("syncfs", os.stat(f"/proc/self/fd/{fd}").st_ino))
        return real_syncfs(fd)

    monkeypatch.setattr(storage.durable, "_libc_syncfs", lambda: counted)
    entries = [entry(cols) for cols in range(1, 41)]
    stored = storage.cache.store_many(entries)
    assert syncs == [("syncfs", cache_dir().stat().st_ino)]  # of the cache's folder
    assert [kept for kept, _ in stored] == [replace(e, runs=(), declared=()) for e in entries]
    assert [storage.cache.read(path) for _, path in stored] == [kept for kept, _ in stored]
    syncs.clear()
    store(entry(41))  # one entry alone is written durably, as before
    assert syncs.count("fsync") == 2 and "sync" not in syncs and len(syncs) == 2


def test_without_syncfs_a_batch_fsyncs_each_file_and_folder_it_wrote(monkeypatch):
    """Where libc has no syncfs: an fsync of each entry written and of each folder whose
    listing changed (the cache's, the kernel's, the group's), never os.sync()."""
    fsynced: list[Path] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        fsynced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(storage.cache.os, "fsync", counted)
    monkeypatch.setattr(storage.cache.os, "sync", lambda: fsynced.append(Path("sync")))
    monkeypatch.setattr(storage.durable, "_libc_syncfs", lambda: None)
    entries = [entry(cols) for cols in range(1, 11)]
    stored = storage.cache.store_many(entries)
    group = entries[0].path().parent
    assert Path("sync") not in fsynced
    assert sorted(fsynced) == sorted([path for _, path in stored] + [
        cache_dir().parent, cache_dir(), group.parent, group])


def test_a_single_entry_makes_the_folders_it_created_durable(monkeypatch):
    """The new kernel and group folders' names are fsynced in their parents, so the entry
    written durably inside them is not lost with them after a crash."""
    cache_dir().mkdir(parents=True)
    fsynced: list[Path] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        fsynced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(storage.cache.os, "fsync", counted)
    _, path = store(entry(64))
    group = path.parent
    # The cache's folder (it got the kernel's), the kernel's (it got the group), then the
    # entry's temp file and the group's folder (it got the entry).
    assert fsynced[:2] == [cache_dir(), group.parent]
    assert fsynced[-1] == group and len(fsynced) == 4
    fsynced.clear()
    store(entry(65))  # into folders already there: the entry's two fsyncs alone
    assert len(fsynced) == 2 and fsynced[-1] == group


def test_a_sweep_over_many_problems_looks_each_up_in_its_own_file(files_read):
    """lookup_many of N problems reads about N files (one a problem, plus one to learn the
    group), not every entry of the kernel once a problem."""
    for cols in range(1, 201):  # the kernel's entries of 200 problems
        store(entry(cols))
    store(entry(64, kernel="other"))
    asked = [{"rows": 4, "cols": cols, "dtype": "float32"} for cols in (3, 50, 150, 999)]
    files_read.clear()
    found = storage.cache.lookup_many("softmax", softmax_source(), asked)
    assert [[e.problem for e in hits] for hits in found] == [[p] for p in asked[:3]] + [[]]
    assert len(files_read) <= len(asked) + 1


def test_sweep_run_and_sweep_best_look_a_spec_up_in_one_file_a_problem(files_read, tmp_path):
    """What a `sweep run` without --force and `sweep best SPEC` read of the cache for a
    sweep over many problems: a file each, whatever else the kernel has cached."""
    from sweep.best import _of_spec
    from sweep.run.cache_policy import candidates
    from sweep.spec import load_spec

    problems = [{"rows": 4, "cols": cols, "dtype": "float32"} for cols in (16, 32, 48)]
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(json.dumps({"name": "s", "kernel": "softmax",
                                     "problems": problems,
                                     "space": {"BLOCK_N": [32, 64],
                                               "ROWS_PER_PROGRAM": [1]}}))
    spec = load_spec(spec_path)
    for cols in range(100, 300):  # the kernel's other problems
        store(entry(cols))
    for p in spec.each_problem():
        store(replace(entry(1), problem=dict(p), kernel_source=spec.kernel_source,
                      runs=(spec.fingerprint,)))
    files_read.clear()
    assert len(candidates(spec, "interpret")) == 3
    assert len(files_read) <= 3 + 1
    files_read.clear()
    entries, _ = _of_spec(spec_path)
    assert [e["problem"]["cols"] for e in entries] == [16, 32, 48]
    assert len(files_read) <= 3 + 1
