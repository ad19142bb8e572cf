"""Sudoku puzzles generated offline, with unique solutions (hyperset.txt §5.1 trains on Palm et al.'s hard 9x9 set,
17-34 givens).

Boards have side n = box^2 (4x4 with box 2, 9x9 with box 3), digits 1..n and 0 for a blank. A solution is the
pattern grid (box (r mod box) + r // box + c) mod n under random validity-preserving symmetries; a puzzle removes
cells of it in random order while the solution stays unique, down to the requested number of givens (the
difficulty knob) or as far as uniqueness allows.

Solution grids are split once and for all into a training part and a held-out part (`held_out_grid`: a quarter of
them, by a checksum of the grid): training and validation puzzles (`sudoku_split`) come from the training part, and
an evaluation asks for held-out grids, so that no test solution was ever seen in training. This matters for 4x4
boards, whose generator reaches 192 grids: a test set drawn from all of them repeats training grids many times.
"""

import zlib

import torch

from .hub import load_hub_dataset


def sudoku_solutions(count: int, generator: torch.Generator, box: int = 3) -> torch.Tensor:
    """``count`` valid solutions, (count, n^2) digits 1..n: the pattern grid under digit relabelling, the
    permutations of rows within a band, of bands, of columns within a stack and of stacks, and transposition,
    drawn per board (for 4x4 boards these reach 192 of the 288 grids)."""
    side = box * box

    def within_groups() -> torch.Tensor:  # a random order of the lines that keeps each group of `box` together
        groups = torch.stack([torch.randperm(box, generator=generator) for _ in range(count)])
        inside = torch.stack([torch.stack([torch.randperm(box, generator=generator) for _ in range(box)])
                              for _ in range(count)])
        return (groups[:, :, None] * box + inside).reshape(count, side)

    rows, columns = within_groups(), within_groups()
    line = torch.arange(side)
    base = (box * (line[:, None] % box) + line[:, None] // box + line[None, :]) % side
    grids = base[rows[:, :, None], columns[:, None, :]]
    transposed = torch.rand(count, 1, 1, generator=generator) < 0.5
    grids = torch.where(transposed, grids.transpose(1, 2), grids)
    relabel = torch.stack([torch.randperm(side, generator=generator) for _ in range(count)])
    return torch.gather(relabel, 1, grids.reshape(count, side * side)) + 1


def count_solutions(board: list[int], box: int, limit: int = 2) -> int:
    """Solutions of a board (row-major, 0 = blank), counted up to ``limit``: depth-first search over the blank
    with the fewest candidates, candidates kept as bit masks per row, column and box."""
    side = box * box
    full = (1 << side) - 1
    rows, columns, boxes = [0] * side, [0] * side, [0] * side
    blanks = []
    for cell, digit in enumerate(board):
        r, c = divmod(cell, side)
        if digit:
            bit = 1 << (digit - 1)
            b = (r // box) * box + c // box
            if (rows[r] | columns[c] | boxes[b]) & bit:
                return 0  # a given repeats in a row, column or box
            rows[r], columns[c], boxes[b] = rows[r] | bit, columns[c] | bit, boxes[b] | bit
        else:
            blanks.append((r, c, (r // box) * box + c // box))

    def search(open_cells: list) -> int:
        if not open_cells:
            return 1
        best, best_free = 0, -1
        for index, (r, c, b) in enumerate(open_cells):
            free = full & ~(rows[r] | columns[c] | boxes[b])
            if best_free < 0 or bin(free).count("1") < bin(best_free).count("1"):
                best, best_free = index, free
                if free == 0:
                    return 0
        r, c, b = open_cells[best]
        rest = open_cells[:best] + open_cells[best + 1:]
        found = 0
        while best_free and found < limit:
            bit = best_free & -best_free
            best_free ^= bit
            rows[r] |= bit
            columns[c] |= bit
            boxes[b] |= bit
            found += search(rest)
            rows[r] ^= bit
            columns[c] ^= bit
            boxes[b] ^= bit
        return found

    return search(blanks)


def unique_puzzle(solution: list[int], givens: int, box: int, generator: torch.Generator) -> list[int]:
    """Blank cells of ``solution`` in random order, skipping any whose removal would allow a second solution,
    until ``givens`` cells remain (or no cell can go)."""
    board = list(solution)
    kept = len(board)
    for cell in torch.randperm(len(board), generator=generator).tolist():
        if kept == givens:
            break
        digit, board[cell] = board[cell], 0
        if count_solutions(board, box) == 1:
            kept -= 1
        else:
            board[cell] = digit
    return board


HELD_OUT_EVERY = 4  # one grid in four is held out for evaluation


def held_out_grid(solution: torch.Tensor) -> bool:
    """Whether a solution grid belongs to the held-out part: a checksum of its digits, one in ``HELD_OUT_EVERY``."""
    return zlib.crc32(bytes(solution.to(torch.uint8).tolist())) % HELD_OUT_EVERY == 0


def _solutions_of_part(count: int, generator: torch.Generator, box: int, held_out: bool) -> torch.Tensor:
    """``count`` solutions drawn until that many fall in the requested part of the grid split."""
    kept = []
    while len(kept) < count:
        kept += [grid for grid in sudoku_solutions(2 * count, generator, box) if held_out_grid(grid) == held_out]
    return torch.stack(kept[:count])


def sudoku_puzzles(count: int, givens: tuple[int, int], box: int, seed: int,
                   held_out: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(puzzles, solutions), (count, n^2) each: unique-solution puzzles with a uniform number of givens in
    ``givens`` (fewer givens: harder; a puzzle stops above the target when no cell can go without losing
    uniqueness), on solution grids of the training part, or of the ``held_out`` part."""
    generator = torch.Generator().manual_seed(seed)
    solutions = _solutions_of_part(count, generator, box, held_out)
    targets = torch.randint(givens[0], givens[1] + 1, (count,), generator=generator).tolist()
    puzzles = [unique_puzzle(solution.tolist(), target, box, generator) for solution, target in zip(solutions, targets)]
    return torch.tensor(puzzles), solutions


def sudoku_examples(count: int, givens: tuple[int, int], box: int, seed: int,
                    held_out: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-classification examples (hyperset.txt §5.1 format): ``input_ids`` digits with 0 a blank, labels
    digit - 1 on blanks and -100 on givens; on held-out solution grids with ``held_out``."""
    puzzles, solutions = sudoku_puzzles(count, givens, box, seed, held_out)
    return puzzles, (solutions - 1).masked_fill(puzzles != 0, -100)


def sudoku_split(examples: int, givens: tuple[int, int], validation_fraction: float, seed: int, box: int = 3):
    """`sudoku_examples` (training grids) split into (train inputs, train labels, validation inputs, validation
    labels)."""
    inputs, labels = sudoku_examples(examples, givens, box, seed)
    cut = int(examples * (1 - validation_fraction))
    return inputs[:cut], labels[:cut], inputs[cut:], labels[cut:]


def hub_sudoku_split(data, seed: int):
    """A `datasets` Sudoku source (e.g. the hard set of Palm et al. that hyperset.txt §5.1 uses): puzzles and
    solutions as strings of digits in ``puzzle_column`` / ``solution_column`` ("0" or "." for a blank), in the
    format of `sudoku_examples`, split by ``validation_fraction`` with ``seed``."""
    parts = load_hub_dataset(data).train_test_split(test_size=data.validation_fraction, seed=seed)

    def digits(dataset, column: str) -> torch.Tensor:
        return torch.tensor([[0 if c == "." else int(c) for c in row] for row in dataset[column]])

    def tensors(dataset):
        puzzles, solutions = digits(dataset, data.puzzle_column), digits(dataset, data.solution_column)
        return puzzles, (solutions - 1).masked_fill(puzzles != 0, -100)

    return (*tensors(parts["train"]), *tensors(parts["test"]))
