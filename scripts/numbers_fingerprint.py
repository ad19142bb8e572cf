"""The numbers a refactor must not move, recorded at one checkout and compared with another's.

    python scripts/numbers_fingerprint.py record CHECKOUT OUT.pt   # e.g. a `git worktree add` of the commit before
    python scripts/numbers_fingerprint.py compare BEFORE.pt AFTER.pt

For every contract tester (tests/zoo.py's `TESTERS`: each head, each FEM prior) at seed 0 it records the perturbed
model's state dict (weights at a seed, and the keys an old checkpoint carries), the loss and every parameter's gradient
of the tester's inputs in training mode, the eval-mode outputs with their energy trace, and for causal LMs the greedy
tokens of a left-padded batch with and without the cache. `compare` asks equality to the bit, then loads the earlier
state dicts into the later checkout's models (`CHECKOUT` of the later record must be this one) to show old checkpoints
still load strictly.
"""

import argparse
import sys
from pathlib import Path

import torch


def _import_testers(checkout: Path):
    sys.path[:0] = [str(checkout), str(checkout / "tests"), str(checkout / "tests" / "support")]
    from zoo import TESTERS, name_of

    return [(name_of(tester), tester) for tester in TESTERS]


def _numbers(tester) -> dict[str, torch.Tensor]:
    model = tester.build()
    inputs = tester.make_inputs(model.config)
    record = {f"state.{key}": value.clone() for key, value in model.state_dict().items()}
    model.train()
    torch.manual_seed(1)
    loss = model(**inputs).loss
    loss.backward()
    record["loss"] = loss.detach()
    record.update({f"grad.{name}": p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    model.eval()
    with torch.no_grad():
        outputs = model(**tester.without_labels(inputs), output_energies=True)
    for key, value in outputs.items():
        if torch.is_tensor(value):
            record[f"output.{key}"] = value
        elif key == "energies":
            record.update({f"energy.{index}.{quantity}": tensor for index, layer in enumerate(value.layers)
                           for quantity, tensor in layer.items()})
    if tester.causal_lm:
        prompts = tester._left_padded_prompts(model)
        for use_cache in (True, False):
            record[f"generate.cache={use_cache}"] = model.generate(
                **prompts, max_new_tokens=8, do_sample=False, use_cache=use_cache,
                pad_token_id=model.config.pad_token_id)
    return record


def record(checkout: Path, out: Path) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    numbers = {name: _numbers(tester) for name, tester in _import_testers(checkout)}
    torch.save(numbers, out)
    print(f"{out}: {len(numbers)} models, {sum(map(len, numbers.values()))} tensors")


def compare(before_path: Path, after_path: Path) -> int:
    before, after = torch.load(before_path), torch.load(after_path)
    differences = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name, {}), after.get(name, {})
        differences += [f"{name}: {key} only {'before' if key in old else 'after'}" for key in old.keys() ^ new.keys()]
        differences += [f"{name}: {key} differs" for key in old.keys() & new.keys()
                        if not torch.equal(old[key], new[key])]
    testers = dict(_import_testers(Path(__file__).parents[1]))
    for name, numbers in before.items():
        model = testers[name].build()
        state = {key.removeprefix("state."): value for key, value in numbers.items() if key.startswith("state.")}
        model.load_state_dict(state, strict=True)
    print(f"{len(before)} models, {sum(map(len, before.values()))} tensors compared to the bit; "
          f"every earlier state dict loads strictly; {len(differences)} differences")
    print("\n".join(differences))
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    recording = verbs.add_parser("record")
    recording.add_argument("checkout", type=Path)
    recording.add_argument("out", type=Path)
    comparing = verbs.add_parser("compare")
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    arguments = parser.parse_args()
    if arguments.verb == "record":
        record(arguments.checkout, arguments.out)
        return 0
    return compare(arguments.before, arguments.after)


if __name__ == "__main__":
    sys.exit(main())
