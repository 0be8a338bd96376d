"""Faults: a process killed mid-write, concurrent shards, stage keys, malformed input."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from featpipe.fileio import shard_of
from featpipe.manifest import from_rows
from featpipe.store import Store
from tests.conftest import REPO, run_cli

N_ITEMS = 40
SLOW_WRITER = """
import sys, time
import numpy as np
from featpipe.manifest import from_rows
from featpipe.parallel import ItemOutput, run_items
from featpipe.store import Store

store_dir, log = sys.argv[1], sys.argv[2]
ids = [f"item{i:03d}" for i in range(@N@)]
manifest = from_rows([(i, "", ["a"], ["train"]) for i in ids], root=store_dir)
stage = Store(store_dir).stage("slow", {"n": @N@}, items=manifest)


class Slow:
    def __call__(self, batch):
        out = []
        for item_id in batch:
            with open(log, "a") as handle:
                handle.write(item_id + "\\n")
            time.sleep(0.05)
            value = int(item_id[4:])
            out.append(ItemOutput(np.full((512, 256), value, np.float32),
                                  extras={"timestamps": np.arange(512) + value}))
        return out


print(run_items(stage, ids, Slow()).line(), flush=True)
"""


def ledger_lines(stage_path: Path) -> dict[str, list[dict]]:
    return {p.name: [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted((stage_path / "ledger").glob("*.jsonl"))}


def test_sigkill_mid_write_leaves_no_partial_array_and_resumes(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(SLOW_WRITER.replace("@N@", str(N_ITEMS)))
    store_dir, log = tmp_path / "store", tmp_path / "computed.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), str(store_dir), str(log)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    stage_dirs = []
    while time.time() < deadline:
        stage_dirs = list((store_dir / "stages").glob("slow-*"))
        ledger = list(stage_dirs[0].glob("ledger/*.jsonl")) if stage_dirs else []
        if ledger and len(ledger[0].read_text().splitlines()) >= 5:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    # aim the kill at a moment when an item is being written (a temporary file exists)
    aim_until = time.time() + 3
    while time.time() < aim_until and not list(stage_dirs[0].glob("items/*/*.tmp.*")):
        pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    stage = Store(store_dir).stage_by_folder(stage_dirs[0].name)
    done_before = stage.done_ids()
    assert 5 <= len(done_before) < N_ITEMS
    # every array file that exists loads completely with the right content; tmp files are
    # never taken for items
    item_files = {stage.item_path(i): i for i in stage.items.ids}
    for path in (stage.path / "items").rglob("*"):
        if path.is_dir() or ".tmp." in path.name:
            continue
        if path.name.endswith("+timestamps.npy"):
            continue
        item_id = item_files[path]
        array = np.load(path, allow_pickle=False)
        assert array.shape == (512, 256) and np.all(array == int(item_id[4:]))
    for item_id in done_before:
        np.testing.assert_array_equal(stage.read_extra(item_id, "timestamps"),
                                      np.arange(512) + int(item_id[4:]))
    first_log = log.read_text().split()
    killed_tmp = [p.name for p in (stage.path / "items").rglob("*.tmp.*")]

    rerun = subprocess.run([sys.executable, str(script), str(store_dir), str(log)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{N_ITEMS - len(done_before)} done, {len(done_before)} skipped" in rerun.stdout
    recomputed = log.read_text().split()[len(first_log):]
    assert not set(recomputed) & done_before
    ledgers = ledger_lines(stage.path)
    assert len(ledgers) == 2
    old_ledger, new_ledger = sorted(ledgers.values(), key=lambda lines: lines[0]["time"])
    assert {e["id"] for e in old_ledger} == done_before
    assert len(new_ledger) == N_ITEMS - len(done_before)
    assert {e["id"] for e in new_ledger} == set(stage.items.ids) - done_before
    assert stage.is_complete()
    for item_id in stage.items.ids:
        assert np.all(stage.read_item(item_id) == int(item_id[4:]))
    # the killed writer's temporary file (if the kill hit a write) is swept by gc
    print("temporary files left by the kill:", killed_tmp)
    gc = run_cli("cache", "gc", "--store", store_dir)
    assert not [p for p in (stage.path / "items").rglob("*.tmp.*")], gc.stdout


def make_npz_import(tmp_path, n=N_ITEMS):
    ids = [f"clip/{i:02d}" for i in range(n)]
    from_rows([(i, "", ["a" if k % 2 else "b"], ["train"]) for k, i in enumerate(ids)],
              tmp_path).write(tmp_path / "m.csv")
    np.savez(tmp_path / "f.npz", **{i: np.full((3, 4), k, np.float32)
                                    for k, i in enumerate(ids)})
    return ids, ["import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz"]


def test_two_shards_at_once_complete_disjointly(tmp_path):
    ids, args = make_npz_import(tmp_path)
    store_dir = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-m", "featpipe", *map(str, args), "--store",
                               str(store_dir), "--name", "feat", "--shard", f"{k}/2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    expected = [sum(shard_of(i, 2) == k for i in ids) for k in range(2)]
    assert 0 < expected[0] < N_ITEMS
    for k, (out, _) in enumerate(outputs):
        assert (f"summary: {expected[k]} done, 0 skipped (already complete), 0 failed, "
                f"{N_ITEMS - expected[k]} in other shards") in out
    stage = Store(store_dir).resolve("feat")
    ledgers = list(ledger_lines(stage.path).values())
    assert len(ledgers) == 2
    per_process = [{e["id"] for e in lines} for lines in ledgers]
    assert not per_process[0] & per_process[1]
    assert per_process[0] | per_process[1] == set(ids)
    assert stage.is_complete()
    for k, item_id in enumerate(ids):
        assert np.all(stage.read_item(item_id) == k)
    again = run_cli(*args, "--store", store_dir, "--name", "feat")
    assert f"summary: 0 done, {N_ITEMS} skipped" in again.stdout


def test_changed_parameter_new_key_same_parameters_same_stage(tmp_path, cli):
    _, args = make_npz_import(tmp_path, n=4)
    store_dir = tmp_path / "store"
    key = re.compile(r"stage (import-[0-9a-f]{16}) as 'feat'")
    first = cli(*args, "--store", store_dir, "--name", "feat")
    same = cli(*args, "--store", store_dir, "--name", "feat")
    half = cli(*args, "--store", store_dir, "--name", "feat16", "--dtype", "float16")
    first_key = key.search(first.output).group(1)
    assert key.search(same.output).group(1) == first_key
    assert "0 done, 4 skipped" in same.output
    half_key = re.search(r"stage (import-[0-9a-f]{16}) as 'feat16'", half.output).group(1)
    assert half_key != first_key and "4 done, 0 skipped" in half.output
    store = Store(store_dir)
    assert store.resolve("feat16").read_item("clip/01").dtype == np.float16
    # a changed source file is a changed input: new stage
    time.sleep(0.01)
    np.savez(tmp_path / "f.npz", **{f"clip/{i:02d}": np.zeros((3, 4)) for i in range(4)})
    changed = cli(*args, "--store", store_dir, "--name", "feat")
    assert key.search(changed.output).group(1) != first_key
    assert store.resolve("feat").read_item("clip/01").max() == 0


def test_malformed_manifest_on_import_names_the_line(tmp_path, cli):
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,x,l,train\nb,y,l,maybe\n")
    np.savez(tmp_path / "f.npz", a=np.ones(2), b=np.ones(2))
    proc = cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz",
               "--store", tmp_path / "s", "--name", "x")
    assert proc.exit_code == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: manifest {tmp_path / 'm.csv'}, line 3: split1 value 'maybe' for 'b' must be "
        "'train', 'test' or empty"]
