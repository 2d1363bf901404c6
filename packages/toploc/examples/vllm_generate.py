"""Generate with vLLM, prove each completion with TOPLOC, ship it as JSON (the format of hf_generate.py).

    python vllm_generate.py [MODEL] [OUT]    # then, in another process: python verify.py [MODEL] [OUT]

toploc.vllm adds a seeded sampler (a vLLM logits processor) and a capture of the final-norm
hidden states to an in-process engine; collect() returns each request's tokens, log-probs and proofs.
"""

import base64
import json
import sys

from transformers import AutoTokenizer
from vllm import SamplingParams, TokensPrompt

from toploc.vllm import checkable, checkable_llm, collect

MODEL = sys.argv[1] if len(sys.argv) > 1 else "HuggingFaceTB/SmolLM2-135M-Instruct"
OUT = sys.argv[2] if len(sys.argv) > 2 else "rollouts.json"
SEED, TEMPERATURE, MAX_NEW_TOKENS = 2024, 1.0, 48
PROMPTS = ["What is 7 * 6?", "Name a prime number larger than 100."]

tokenizer = AutoTokenizer.from_pretrained(MODEL)
prompt_ids = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
# The engine runs in this process (checkable_llm sets VLLM_ENABLE_V1_MULTIPROCESSING=0).
llm = checkable_llm(MODEL, dtype="float32", max_model_len=512, kv_cache_memory_bytes=1 << 28)
params = [
    checkable(SamplingParams(max_tokens=MAX_NEW_TOKENS), seed=SEED, sequence_id=i, temperature=TEMPERATURE)
    for i in range(len(PROMPTS))
]
outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params)
records = []
for i, out in enumerate(collect(params, outputs)):  # tokens, log-probs and proofs per request
    records.append(
        {
            "prompt_ids": prompt_ids[i],
            "token_ids": list(out.token_ids),
            "text": tokenizer.decode(out.token_ids, skip_special_tokens=True),
            "logprobs": list(out.logprobs),
            "proofs": base64.b64encode(out.proofs).decode(),
            "seed": SEED,
            "sequence_id": i,
            "temperature": TEMPERATURE,
        }
    )
with open(OUT, "w") as handle:
    json.dump(records, handle)
print(f"wrote {len(records)} completions ({[len(r['token_ids']) for r in records]} tokens) to {OUT}")
