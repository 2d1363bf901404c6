"""The ``toploc`` command line: inspect valid and invalid proofs, and a tiny benchmark run."""

from __future__ import annotations

import base64

import torch

from toploc import build_proofs_bytes
from toploc.cli import main


def test_inspect_base64_hex_and_file(tmp_path, capsys) -> None:
    proofs = build_proofs_bytes(torch.randn(64, 128), 32, 128, True)
    modulus = int.from_bytes(proofs[0][:2], "big")
    assert main(["inspect", base64.b64encode(proofs[0]).decode()]) == 0
    assert f"modulus {modulus}" in capsys.readouterr().out
    assert main(["inspect", proofs[1].hex()]) == 0
    path = tmp_path / "proofs.bin"
    path.write_bytes(b"".join(proofs))
    assert main(["inspect", str(path)]) == 0
    assert "2 proof(s) of 258 bytes" in capsys.readouterr().out.splitlines()[-3]


def test_inspect_rejects_malformed(capsys) -> None:
    assert main(["inspect", "00" * 258]) == 2  # modulus 0
    assert "modulus 0" in capsys.readouterr().err
    assert main(["inspect", "not base64!"]) == 2
    assert "not a file, a hex string or base64" in capsys.readouterr().err


def test_inspect_missing_file_says_so(tmp_path, capsys) -> None:
    # Before: "toploc inspect: invalid proof: invalid base64".
    for missing in ["missing.bin", str(tmp_path / "proofs" / "missing"), "~/p.b64"]:
        assert main(["inspect", missing]) == 2
        assert capsys.readouterr().err == f"toploc inspect: no such file: {missing}\n"


def test_bench_smoke(capsys) -> None:
    main(["bench", "--hidden", "256", "--tokens", "64", "--repeats", "1"])
    table = capsys.readouterr().out
    assert "| 256 | 64 |" in table and "8.0625" in table
