"""The rule for the name of a job or a gang (gmux.protocol.job_name_problem): one rule, for gmuxd, the cluster
scheduler and the command line, in the same words. A name picks a job out wherever its id would (gmux kill NAME),
so none may read as a job id, as another name under Unicode's compatibility forms (NFKC), or mix scripts whose
letters look alike."""
import argparse
import re
import unicodedata

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from gmux import protocol
from gmux.cli.argtypes import cluster_job_name, job_name
from gmux.protocol import ProtocolError, job_name_problem

REFUSED = [   # (name, what the refusal says)
    ("ј45", "'ј45' looks like a job id (gmux names jobs j1, j2, ...): it is written with 'ј' (U+0458 CYRILLIC "
            "SMALL LETTER JE); choose another name"),
    ("Ｊ99", "looks like a job id (gmux names jobs j1, j2, ...): it is written with 'Ｊ' (U+FF2A FULLWIDTH"),
    ("j45", "'j45' looks like a job id (gmux names jobs j1, j2, ...); choose another name"),
    ("J7", "'J7' looks like a job id"),          # read as j7 by a person, though gmuxd's ids are lower case
    ("j٤٥", "looks like a job id"),              # Arabic-Indic digits
    ("ﬁne", "'ﬁne' reads as 'fine' (written with 'ﬁ' (U+FB01 LATIN SMALL LIGATURE FI)); type the name in plain"),
    ("rеsnet", "'rеsnet' mixes Latin and Cyrillic letters in a word ('r' (U+0072 LATIN SMALL LETTER R), 'е' "
               "(U+0435 CYRILLIC SMALL LETTER IE)), which look alike; write each word in one of them"),
    ("αlpha", "mixes Greek and Latin letters in a word"),
    ("μP-sweep", "mixes Greek and Latin letters in a word"),
    ("", "'' is not a valid name"),
    ("my job", "'my job' is not a valid name (letters, digits, '-', '_', '.'; not starting with '.')"),
    (".hidden", "is not a valid name"),
]
# including every name gmux gives itself: a cluster job's local one (c7, c7.0), torchrun's gang, an unnamed gang's
TAKEN = ["resnet-50", "b12", "训练", "обучение", "ab.v2", "J-7", "j-7", "jx45", "β-vae", "vae_β2", "μ-p", "c7",
         "c7.0", "torchrun-4242", "gang-j12", "gang-j12-0", "x" * 128]


@pytest.mark.parametrize("name, said", REFUSED)
def test_refused_by_gmuxd_the_cluster_and_the_command_line_in_the_same_words(name, said):
    assert said in job_name_problem(name)
    with pytest.raises(argparse.ArgumentTypeError) as cli:
        job_name(name)
    assert str(cli.value) == job_name_problem(name)
    # (a registration is held to it by gmuxd, only for a new job: tests/node/test_daemon_handler.py)
    frames = [({"type": "submit", "admin": "a", "argv": ["python", "t.py"], "cwd": "/", "name": name}, None,
               "submit.name: "),
              ({"type": "c_submit", "argv": ["python", "t.py"], "cwd": "/", "name": name}, protocol.CLUSTER_MESSAGES,
               "c_submit.name: ")]
    for fields, table, field in frames:
        with pytest.raises(ProtocolError) as wire:
            protocol.decode(msgpack.packb({"v": protocol.VERSION, "id": 1, **fields}), table)
        assert str(wire.value) == field + job_name_problem(name)


@pytest.mark.parametrize("name", TAKEN)
def test_taken(name):
    assert job_name_problem(name) is None and job_name(name) == name
    protocol.encode("submit", 1, admin="a", argv=["python", "t.py"], cwd="/", name=name)
    protocol.encode("register", 1, pid=1, argv=["x"], gang={"id": name, "rank": 0, "size": 2})


@pytest.mark.parametrize("name", ["c7", "C12", "c٤"])
def test_a_cluster_job_is_not_named_as_another_cluster_jobs_id(name):
    """`gmux submit --cluster --name c7` was taken, and hid cluster job c7 wherever a job is named."""
    said = protocol.cluster_job_name_problem(name)
    assert said.startswith(f"{name!r} looks like a cluster job's id") or "looks like a job id" in said
    with pytest.raises(ProtocolError) as wire:
        protocol.decode(msgpack.packb({"v": protocol.VERSION, "id": 1, "type": "c_submit", "argv": ["python", "t.py"],
                                       "cwd": "/", "name": name}), protocol.CLUSTER_MESSAGES)
    assert str(wire.value) == "c_submit.name: " + said
    with pytest.raises(argparse.ArgumentTypeError) as cli:
        cluster_job_name(name)
    assert str(cli.value) == said
    assert job_name_problem("c7") is None       # on a machine, cluster job c7's own job is named c7


NAME_CHARS = st.characters(categories=("L", "N", "M"), include_characters="-_.")


@settings(max_examples=2000, deadline=None)
@given(st.text(NAME_CHARS, min_size=1, max_size=12) | st.from_regex(r"[jJ]\d{1,4}", fullmatch=True))
def test_a_name_taken_is_written_one_way_reads_as_no_id_and_each_word_is_of_one_lookalike_script(name):
    problem = job_name_problem(name)
    assert problem is None or problem.startswith(repr(name))
    if problem is None:
        folded = unicodedata.normalize("NFKC", name)
        assert folded == name
        assert not (folded[0] in "jJ" and folded[1:].isdecimal())
        assert not name.startswith("-")     # (gmux kill -foo reads it as an option)
        for word in re.findall(r"[^\W\d_]+", name):
            scripts = {unicodedata.name(c, "").split(" ")[0] for c in word}
            assert len(scripts & {"LATIN", "GREEK", "CYRILLIC"}) <= 1, name


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20))
def test_any_text_gets_an_answer_not_an_exception(text):
    problem = job_name_problem(text)
    assert problem is None or isinstance(problem, str)
