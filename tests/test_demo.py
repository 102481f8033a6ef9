"""The main job, on a small workload: the table it prints and the PNG it writes."""

import re

import pytest

from jensen_core.__main__ import main

pytestmark = pytest.mark.slow  # runs the whole demo


def test_demo_prints_the_table_and_writes_the_histogram(tmp_path, capsys):
    png = tmp_path / "hist.png"
    rc = main(
        ["demo", "--heads", "2", "--chunk-tokens", "256", "--cached-chunks", "3", "--repeats", "1", "--out", str(png)]
    )
    assert rc == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        m = re.match(
            r"^(BF16 cache|INT2 RTN \+ Jensen|INT2 RTN|INT2 QuaRot \+ Jensen|INT2 QuaRot|INT4 RTN)\s+([-+.\deE\s]+)$",
            line,
        )
        if m:
            rows[m.group(1)] = [float(x) for x in m.group(2).split()]
    assert set(rows) == {
        "BF16 cache",
        "INT2 RTN",
        "INT2 RTN + Jensen",
        "INT2 QuaRot",
        "INT2 QuaRot + Jensen",
        "INT4 RTN",
    }
    mib, bits, dps, jsd, mse, ms = zip(*rows.values())
    by = {name: dict(zip(("mib", "bits", "dps", "jsd", "mse", "ms"), vals)) for name, vals in rows.items()}
    assert by["BF16 cache"]["bits"] == 16.0 and by["INT2 RTN"]["bits"] == 2.75 and by["INT4 RTN"]["bits"] == 4.75
    assert by["INT2 RTN"]["mib"] < by["INT4 RTN"]["mib"] < by["BF16 cache"]["mib"]
    assert by["INT2 RTN"]["dps"] > 0 and abs(by["INT2 QuaRot + Jensen"]["dps"]) < by["INT2 QuaRot"]["dps"]
    assert by["INT2 RTN + Jensen"]["jsd"] < by["INT2 RTN"]["jsd"]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_command_is_an_error(capsys):
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().out
