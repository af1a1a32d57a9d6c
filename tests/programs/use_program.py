"""A program with an autotuned kernel, which knows nothing of sweep: for each size given it
adds one to a vector (float32, or float16 for a size written "16:half"), checks the answer
and prints the config the launch ran as a JSON line. "exit=K" ends it with exit code K."""

import json
import sys

import torch
from use_kernels import add_one, grid


def main(argv: list[str]) -> int:
    code = 0
    for word in argv:
        if word.startswith("exit="):
            code = int(word[5:])
            continue
        size, _, kind = word.partition(":")
        n = int(size)
        x = torch.arange(n, dtype=torch.float16 if kind == "half" else torch.float32)
        y = torch.empty_like(x)
        add_one[grid](x, y, n)
        if not torch.equal(y, x + 1):
            print(f"wrong answer for N={n}", file=sys.stderr)
            return 1
        ran = {k: v for k, v in add_one.best_config.all_kwargs().items() if v is not None}
        print(json.dumps({"N": n, "config": ran}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
