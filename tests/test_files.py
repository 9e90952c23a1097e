"""hscl_zoo/_files.py: a file's sha256 and a page's generated block, against values derived by hand."""

from __future__ import annotations

import hashlib

import pytest

from hscl_zoo._files import replace_block, sha256_file


def test_sha256_of_a_file_read_in_blocks_is_hashlibs_of_its_bytes(tmp_path):
    data = bytes(range(256)) * 5000  # 1.28 MB: more than one read block
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(str(tmp_path / "empty")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_only_the_first_block_of_a_name_is_replaced_and_the_rest_kept_as_it_was():
    begin, end = "<!-- results:x -->", "<!-- /results:x -->"
    page = f"intro\n{begin}\nold\n{end}\nmiddle, quoting {begin} and {end} in prose\n{begin}\nkept\n{end}\ntail\n"
    expected = f"intro\n{begin}\nnew\n{end}\nmiddle, quoting {begin} and {end} in prose\n{begin}\nkept\n{end}\ntail\n"
    assert replace_block(page, "x", "new\n") == expected


def test_a_page_without_both_markers_is_refused_with_what_to_add():
    with pytest.raises(ValueError, match=r"no <!-- results:x --> \.\.\. <!-- /results:x --> block .* add the two markers"):
        replace_block("<!-- results:x --> but no end", "x", "body")
