"""Hostile inputs run in a child process: the parent asserts the child exited normally
(no SIGSEGV/SIGFPE/abort, reference defect 4) and that every case raised the expected type."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, torch
    from toploc import ActivationError, ProofFormatError, verify_proofs_bytes, verify_proofs_base64, build_proofs_bytes
    acts = torch.randn(64, 256).to(torch.bfloat16)
    good = build_proofs_bytes(acts, 32, 128, True)
    cases = {
        "null_proof": lambda: verify_proofs_bytes(acts, [b"\\x00" * 258] * 2, 32, 128, True),
        "zero_coeffs": lambda: verify_proofs_bytes(acts, [bytes.fromhex("ffd9")] * 2, 32, 128, True),
        "too_many": lambda: verify_proofs_bytes(acts, good * 2, 32, 128, True),
        "too_few": lambda: verify_proofs_bytes(acts, good[:1], 32, 128, True),
        "empty_list": lambda: verify_proofs_bytes(acts, [], 32, 128, True),
        "not_a_list": lambda: verify_proofs_bytes(acts, b"abc", 32, 128, True),
        "str_in_bytes": lambda: verify_proofs_bytes(acts, ["x", "y"], 32, 128, True),
        "bad_b64": lambda: verify_proofs_base64(acts, ["!!!!", "????"], 32, 128, True),
        "fp16": lambda: verify_proofs_bytes(acts.half(), good, 32, 128, True),
        "fp32": lambda: verify_proofs_bytes(acts.float(), good, 32, 128, True),
        "int": lambda: verify_proofs_bytes(acts.to(torch.int32), good, 32, 128, True),
        "nan": lambda: verify_proofs_bytes(acts.float().fill_(float("nan")), good, 32, 128, True),
        "non_contiguous": lambda: verify_proofs_bytes(acts.T.contiguous().T, good, 32, 128, True),
        "topk_too_big": lambda: verify_proofs_bytes(acts, good, 32, 10**6, True),
        "3d": lambda: verify_proofs_bytes(acts[None], good, 32, 128, True),
        "empty_acts": lambda: verify_proofs_bytes(acts[:0], good, 32, 128, True),
        "scalar": lambda: verify_proofs_bytes(torch.tensor(1.0), good, 32, 128, True),
        "none": lambda: verify_proofs_bytes(None, good, 32, 128, True),
    }
    outcome = {}
    for name, call in cases.items():
        try:
            result = call()
            outcome[name] = "ok:" + ",".join(str(r.exp_mismatches) for r in result)
        except (ProofFormatError, ActivationError) as exc:
            outcome[name] = type(exc).__name__
    print(json.dumps(outcome))
    """
)


def test_hostile_inputs_in_subprocess() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {
        "null_proof": "ProofFormatError",
        "zero_coeffs": "ProofFormatError",
        "too_many": "ProofFormatError",
        "too_few": "ProofFormatError",
        "empty_list": "ProofFormatError",
        "not_a_list": "ProofFormatError",
        "str_in_bytes": "ProofFormatError",
        "bad_b64": "ProofFormatError",
        "fp16": "ok:" + outcome["fp16"][3:],  # rounded to bf16: verifies with small drift
        "fp32": "ok:0,0",  # fp32 -> bf16 is exact for bf16-representable values
        "int": "ActivationError",
        "nan": "ActivationError",
        "non_contiguous": "ok:0,0",
        "topk_too_big": "ProofFormatError",  # proofs of 258 bytes do not have 10^6 coefficients
        "3d": "ActivationError",
        "empty_acts": "ProofFormatError",
        "scalar": "ActivationError",
        "none": "ActivationError",
    }
