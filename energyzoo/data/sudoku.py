"""Sudoku puzzles generated offline, with unique solutions (hyperset.txt §5.1 trains on Palm et al.'s hard 9x9 set,
17-34 givens).

Boards have side n = box^2 (4x4 with box 2, 9x9 with box 3), digits 1..n and 0 for a blank. A solution is the
pattern grid (box (r mod box) + r // box + c) mod n under random validity-preserving symmetries; a puzzle removes
cells of it in random order while the solution stays unique, down to the requested number of givens (the
difficulty knob) or as far as uniqueness allows.

Solution grids are split once and for all into three parts by a checksum of the grid (`grid_part`): a quarter held
out for tests, an eighth for validation, the rest for training. Training and validation puzzles (`sudoku_split`)
come from their own parts and an evaluation asks for held-out grids, so that no validation or test solution was
ever seen in training. This matters for 4x4 boards, whose generator reaches 192 grids: drawn from one pool, a
validation set repeats training puzzles (13-17 of 400 did), and the best checkpoint is picked on memorisable data.
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


GRID_PARTS = ("train", "validation", "test")


def grid_part(solution: torch.Tensor) -> str:
    """The part a solution grid belongs to: by a checksum of its digits modulo 8, 0 and 4 (a quarter) "test", 1 (an
    eighth) "validation", the rest "train"."""
    remainder = zlib.crc32(bytes(solution.to(torch.uint8).tolist())) % 8
    return "test" if remainder % 4 == 0 else "validation" if remainder == 1 else "train"


def _solutions_of_part(count: int, generator: torch.Generator, box: int, part: str) -> torch.Tensor:
    """``count`` solutions drawn until that many fall in ``part`` of the grid split."""
    kept = []
    while len(kept) < count:
        kept += [grid for grid in sudoku_solutions(2 * count, generator, box) if grid_part(grid) == part]
    return torch.stack(kept[:count])


def sudoku_puzzles(count: int, givens: tuple[int, int], box: int, seed: int,
                   part: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """(puzzles, solutions), (count, n^2) each: unique-solution puzzles with a uniform number of givens in
    ``givens`` (fewer givens: harder; a puzzle stops above the target when no cell can go without losing
    uniqueness), on solution grids of ``part`` ("train", "validation" or "test": `grid_part`)."""
    if part not in GRID_PARTS:
        raise ValueError(f"part must be one of {GRID_PARTS}, got {part!r}")
    generator = torch.Generator().manual_seed(seed)
    solutions = _solutions_of_part(count, generator, box, part)
    targets = torch.randint(givens[0], givens[1] + 1, (count,), generator=generator).tolist()
    puzzles = [unique_puzzle(solution.tolist(), target, box, generator) for solution, target in zip(solutions, targets)]
    return torch.tensor(puzzles), solutions


def sudoku_examples(count: int, givens: tuple[int, int], box: int, seed: int,
                    part: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """Token-classification examples (hyperset.txt §5.1 format): ``input_ids`` digits with 0 a blank, labels
    digit - 1 on blanks and -100 on givens; on solution grids of ``part``."""
    puzzles, solutions = sudoku_puzzles(count, givens, box, seed, part)
    return puzzles, (solutions - 1).masked_fill(puzzles != 0, -100)


def sudoku_split(examples: int, givens: tuple[int, int], validation_fraction: float, seed: int, box: int = 3):
    """``examples`` puzzles, ``validation_fraction`` of them on validation grids and the rest on training grids:
    (train inputs, train labels, validation inputs, validation labels)."""
    validation = int(examples * validation_fraction)
    return (*sudoku_examples(examples - validation, givens, box, seed),
            *sudoku_examples(validation, givens, box, seed + 1, part="validation"))


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
