"""CSV and TSV sources are tables: the text_field column of each row is a document (lm/data/tables.py).

They were read as plain text: SST-2's train.tsv trained on its header `sentence\tlabel` and on every `\t0` / `\t1`.
"""

import gzip

import numpy as np
import pytest

from lm.data.errors import DataError
from lm.data.manifest import open_prepared
from lm.data.prepare import prepare
from lm.data.tokenizer import Tokenizer


def run(tmp_path, source, name="out", **cfg):
    cfg = {"tokenizer": "char", "n_sentinels": 2, "val_fraction": 0.0, "workers": 1, "source": str(source), **cfg}
    return prepare(cfg, tmp_path / name, progress=False)


def documents(out) -> list[str]:
    """The prepared train documents, decoded: the token stream cut at each EOS."""
    tok = Tokenizer.load(out)
    ids = np.concatenate([np.fromfile(p, dtype=open_prepared(out)["dtype"]) for p in sorted(out.glob("train_*.bin"))])
    return tok.decode(ids.tolist()).split("<eos>")[:-1]


def test_a_tsv_reads_the_named_column_and_a_missing_one_names_the_columns(tmp_path, data_mirror):
    """MRPC's dev.tsv as it is: a byte-order mark before its header, and 40 of its 408 first sentences starting
    with a quote, which CSV's quoting would have joined to later rows (389 rows)."""
    mrpc = data_mirror / "glue_data" / "MRPC" / "dev.tsv"
    columns = r"\(columns: \['Quality', '#1 ID', '#2 ID', '#1 String', '#2 String'\]\)"
    with pytest.raises(DataError, match=rf"dev.tsv: no column 'text' in its header row {columns}.*--text-field"):
        run(tmp_path, mrpc)
    out = run(tmp_path, mrpc, text_field="#1 String")
    rows = [line.split("\t") for line in mrpc.read_text(encoding="utf-8-sig").splitlines()[1:]]
    assert documents(out) == [row[3] for row in rows]  # no header, ids, label or tab among them
    assert len(rows) == 408 and sum(row[3].startswith('"') for row in rows) == 40
    assert open_prepared(out)["sources"][0]["records"] == 408


def test_csv_quoting_bom_crlf_gzip_and_a_short_row(tmp_path):
    table = '\ufeffid,text\r\n1,"a comma, a ""quote""\r\nand a newline"\r\n\r\n2,plain\r\n'.encode()
    (tmp_path / "t.csv").write_bytes(table)
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(table))
    for name in ("t.csv", "t.csv.gz"):
        out = run(tmp_path, tmp_path / name, name=f"out-{name}")
        assert documents(out) == ['a comma, a "quote"\r\nand a newline', "plain"]  # the blank line is no row
    (tmp_path / "short.csv").write_text("id,text\n1,one\n2\n3,three\n")
    with pytest.raises(DataError, match=r"short.csv: record 2: the row has no 'text' column.*--bad-records skip"):
        run(tmp_path, tmp_path / "short.csv", name="short")
    out = run(tmp_path, tmp_path / "short.csv", name="skip", bad_records="skip")
    assert documents(out) == ["one", "three"] and open_prepared(out)["skipped"]["bad_records"] == 1


def test_non_utf8_in_a_table_names_the_record_or_is_counted(tmp_path):
    (tmp_path / "l.tsv").write_bytes("text\nfine\ncaf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"l.tsv: record 2: invalid UTF-8 at byte 3 of the record.*iconv"):
        run(tmp_path, tmp_path / "l.tsv")
    out = run(tmp_path, tmp_path / "l.tsv", name="replaced", encoding_errors="replace")
    assert documents(out) == ["fine", "caf\ufffd au lait"]
    assert open_prepared(out)["skipped"]["invalid_utf8_sequences"] == 1


def test_a_cell_longer_than_csv_s_default_limit_is_read(tmp_path):
    """csv's field_size_limit is 131,072 characters by default: a longer cell was '_csv.Error: field larger than
    field limit', a traceback."""
    long = "word " * 40_000
    (tmp_path / "long.csv").write_text(f'text\n"{long}"\nshort\n')
    assert [len(d) for d in documents(run(tmp_path, tmp_path / "long.csv"))] == [200_000, 5]


def test_a_header_in_another_case_or_with_spaces_is_read_and_utf16_or_semicolons_are_named(tmp_path):
    """A spreadsheet's export: "Text " (case, a trailing space) named the column the user meant, and was refused."""
    (tmp_path / "h.csv").write_text("id,Text ,label \n1,first row,0\n2,second row,1\n")
    assert documents(run(tmp_path, tmp_path / "h.csv", name="h")) == ["first row", "second row"]
    (tmp_path / "two.csv").write_text("TEXT,text \n1,2\n")  # two loose matches and no exact one: ambiguous
    with pytest.raises(DataError, match=r"two.csv: no column 'text' in its header row \(columns: \['TEXT', 'text '\]"):
        run(tmp_path, tmp_path / "two.csv", name="two")
    (tmp_path / "u.csv").write_bytes("text\nhello\n".encode("utf-16"))  # was: columns ['\udcff\udcfet\x00e\x00...']
    with pytest.raises(DataError, match=r"u.csv: the file is UTF-16 text .*iconv -f utf-16 -t utf-8 .*u.csv > COPY$"):
        run(tmp_path, tmp_path / "u.csv", name="u")
    (tmp_path / "s.csv").write_text("text;label\nhello;1\n")
    with pytest.raises(DataError, match=r"s.csv: no column 'text' .*\['text;label'\]\): it is delimited by semicolons"):
        run(tmp_path, tmp_path / "s.csv", name="s")
