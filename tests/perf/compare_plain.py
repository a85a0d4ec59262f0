"""Side by side, interleaved: llama-cpp-python's Llama.create_completion vs `specchat run --no-draft`.

Not a test (pytest does not collect it): the reproduction of README's "Measured" table.
Usage: python tests/perf/compare_plain.py TARGET.gguf PROMPT_FILE [N_TOKENS] [REPEATS]
The prompt file is used as-is (--raw); decode rate = tokens after the first / time after the first.
"""

import json
import statistics
import subprocess
import sys
import time

from llama_cpp import Llama  # the baseline itself: this script compares against the library directly

target, prompt_file = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 128
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
with open(prompt_file) as fh:
    prompt = fh.read()
llm = Llama(model_path=target, n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)
res: dict[str, list[float]] = {"Llama.create_completion": [], "specchat --no-draft": []}
for _ in range(reps):
    llm.reset()
    stamps = [
        time.perf_counter()
        for _ in llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1, stream=True)
    ]
    res["Llama.create_completion"].append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    out = subprocess.run(
        [
            "specchat",
            "run",
            target,
            "--no-draft",
            "--raw",
            "--temp",
            "0",
            "-n",
            str(n),
            "--json",
            "-t",
            "2",
            "-c",
            "2048",
        ],
        input=prompt,
        capture_output=True,
        text=True,
        check=True,
    )
    res["specchat --no-draft"].append(json.loads(out.stdout)["stats"]["tokens_per_second"])
base = statistics.median(res["Llama.create_completion"])
for name, v in res.items():
    med = statistics.median(v)
    print(f"{name:26s} median {med:6.2f} tok/s  ratio {med / base:.3f}  runs {v}")
