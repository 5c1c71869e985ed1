"""A column of a table's header found by name, as a person who typed the header meant it. Its own module, importing
nothing of lm: lm.glue's readers use it, and lm.data.tables (which imports lm.data.sources, which reads GLUE through
lm.glue.readers) must not be what they import."""


def find_column(header: list[str], column: str) -> int | None:
    """`column`'s position: the name itself, else the one name equal but for case and surrounding whitespace
    (two such are ambiguous: None, as for no match). Shared by lm prepare's tables (lm/data/tables.py), the GLUE
    reader and task=own."""
    if column in header:
        return header.index(column)
    loose = [i for i, name in enumerate(header) if name.strip().casefold() == column.strip().casefold()]
    return loose[0] if len(loose) == 1 else None
