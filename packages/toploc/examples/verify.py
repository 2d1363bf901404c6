"""Check shipped completions against their TOPLOC proofs and seeded draws: one prefill each.

    python verify.py [MODEL] [ROLLOUTS]    # exit status 0 iff every completion passes

Runs in its own process, with nothing from the generator but the JSON records (prompt and
completion token ids, proofs, seed, sequence id, temperature) and the same model weights.
"""

import base64
import json
import sys

import torch
from transformers import AutoModelForCausalLM

from toploc import Thresholds, check_sampling, split_proofs, verify_proofs_bytes

MODEL = sys.argv[1] if len(sys.argv) > 1 else "HuggingFaceTB/SmolLM2-135M-Instruct"
ROLLOUTS = sys.argv[2] if len(sys.argv) > 2 else "rollouts.json"

model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
with open(ROLLOUTS) as handle:
    records = json.load(handle)
failures = 0
for record in records:
    prompt, tokens = record["prompt_ids"], record["token_ids"]
    with torch.no_grad():  # one prefill of prompt + completion; its output is after the final norm
        hidden = model.model(input_ids=torch.tensor([prompt + tokens])).last_hidden_state[0]
        rows = hidden[len(prompt) - 1 : -1]  # row t is the state token t was sampled from
        logits = model.lm_head(rows).float()
    proofs = split_proofs(base64.b64decode(record["proofs"]))
    proof_verdict = Thresholds().check_all(verify_proofs_bytes(rows, proofs, skip_prefill=True))
    sampling = check_sampling(
        logits,
        torch.tensor(tokens),
        record["seed"],
        record["sequence_id"],
        torch.arange(len(tokens)),
        temperature=record["temperature"],
    )
    passed = proof_verdict.passed and sampling.passed
    failures += not passed
    print(
        f"sequence {record['sequence_id']}: {'PASS' if passed else 'FAIL'} ({len(tokens)} tokens; "
        f"proofs: {proof_verdict.reason}; sampling: {sampling.num_mismatches} mismatched draws)"
    )
sys.exit(1 if failures else 0)
