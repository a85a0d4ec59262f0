"""Side by side, interleaved: llama.cpp's `llama-speculative-simple` vs
`specchat run -k 3 --draft-p-min 0.75 --raw`.

Not a test (pytest does not collect it): the reproduction of README's "Measured" table. Build the
example from the llama.cpp that llama-cpp-python vendors (same version), e.g. from its sdist:
  cmake -B build -DLLAMA_BUILD_EXAMPLES=ON && cmake --build build --target llama-speculative-simple
Usage:
  python tests/perf/compare_speculative_simple.py BIN TARGET.gguf DRAFT.gguf PROMPT_FILE [N] [REPEATS]
"""

import json
import re
import statistics
import subprocess
import sys

binary, target, draft, prompt_file = sys.argv[1:5]
n = int(sys.argv[5]) if len(sys.argv) > 5 else 128
reps = int(sys.argv[6]) if len(sys.argv) > 6 else 3
with open(prompt_file) as fh:
    prompt = fh.read()
names = ("llama.cpp speculative-simple", "specchat -k 3")
res: dict[str, list[float]] = {k: [] for k in names}
acc: dict[str, float] = {}
for _ in range(reps):
    out = subprocess.run(
        [binary, "-m", target, "-md", draft, "-f", prompt_file, "-n", str(n), "--spec-type", "draft-simple",
         "--spec-draft-n-max", "3", "--spec-draft-n-min", "0", "--draft-p-min", "0.75", "--temp", "0",
         "-t", "2", "-td", "2", "-c", "2048", "-s", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)", out.stderr)
    rate = re.search(r"accept\s+=\s+([\d.]+)%", out.stderr)
    assert speed and rate, out.stderr[-2000:]
    res[names[0]].append(float(speed.group(1)))
    acc[names[0]] = float(rate.group(1))
    out = subprocess.run(
        ["specchat", "run", target, "--draft", draft, "-k", "3", "--draft-p-min", "0.75", "--raw",
         "--temp", "0", "-n", str(n), "--json", "-t", "2", "-c", "2048"],
        input=prompt, capture_output=True, text=True, check=True,
    )  # fmt: skip
    stats = json.loads(out.stdout)["stats"]
    res[names[1]].append(stats["tokens_per_second"])
    acc[names[1]] = 100 * stats["acceptance_rate"]
base = statistics.median(res[names[0]])
for name, v in res.items():
    print(f"{name:30s} median {statistics.median(v):6.2f} tok/s  ratio {statistics.median(v) / base:.3f}  "
          f"accept {acc[name]:.1f}%  runs {v}")  # fmt: skip
