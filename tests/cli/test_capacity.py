"""exaplan capacity: time-to-train against node count, and the fewest nodes for a deadline."""

import json

from cli.main import main


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_more_nodes_train_faster_and_the_deadline_picks_the_fewest(capsys):
    rc, out, _ = run(capsys, "capacity", "--model", "protein-7b", "--machine", "dgx-h100", "--tokens", "1e11",
                     "--nodes", "2,4,8,16,32", "--global-batch", "1024", "--deadline-days", "3", "--json")
    assert rc == 0
    data = json.loads(out)
    rows = data["rows"]
    assert [r["nodes"] for r in rows] == [2, 4, 8, 16, 32]
    days = [r["days"] for r in rows]
    assert all(b < a for a, b in zip(days, days[1:])), days  # strong scaling still helps at these sizes
    assert all(r["global_batch"] == 1024 for r in rows)
    meeting = [r["nodes"] for r in rows if r["days"] <= 3]
    assert data["fewest_nodes"] == (min(meeting) if meeting else None)
    # time to train is the token budget over the throughput
    r = rows[0]
    assert abs(r["days"] - 1e11 / r["tokens_per_s"] / 86400) < 1e-9 * r["days"]


def test_sizes_that_cannot_keep_the_batch_are_reported_not_fatal(capsys):
    rc, out, _ = run(capsys, "capacity", "--model", "protein-7b", "--machine", "dgx-h100", "--tokens", "1e11",
                     "--nodes", "1,3", "--global-batch", "1", "--json")
    assert rc == 0
    rows = json.loads(out)["rows"]
    assert rows[0]["layout"] is not None
    assert rows[1]["layout"] is None and "global batch" in rows[1]["note"]


def test_bad_node_list_is_exit_2(capsys):
    for bad in ("0,2", "a,b", "100000"):
        rc, _, err = run(capsys, "capacity", "--model", "protein-7b", "--machine", "dgx-h100", "--tokens", "1e11", "--nodes", bad)
        assert rc == 2
        assert err.startswith("exaplan capacity: error: nodes:")
