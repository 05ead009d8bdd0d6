"""The reward of the run in tests/data/premove_run (written by the code before the re-layout):
the share of '7' characters, dense, so a tiny model's updates change its next samples."""


def sevens(completion: str, example) -> float:
    return completion.count("7") / max(len(completion), 1)
