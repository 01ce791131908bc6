"""The runtime directory cannot be planted or redirected: gmuxd makes it, or refuses it and changes nothing."""
import os
import stat

import pytest

from gmux.rundir import RuntimeDir, RuntimeDirError


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_fresh_tree_is_private_and_taken_over_again(tmp_path):
    rd = RuntimeDir(str(tmp_path / "run"))
    rd.create()
    for d in (rd.root, rd.logs(), rd.checkpoints(), rd.exits()):
        assert mode(d) == 0o700
    token = rd.admin_token(create=True)
    rd.create()                                   # a restarted daemon takes its own tree over
    assert rd.admin_token() == token and mode(rd.admin_token_file) == 0o600


def test_symlinked_runtime_dir_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    os.chmod(victim, 0o755)
    (tmp_path / "run").symlink_to(victim)
    with pytest.raises(RuntimeDirError, match="is a symlink"):
        RuntimeDir(str(tmp_path / "run")).create()
    assert mode(victim) == 0o755 and os.listdir(victim) == []


def test_open_dir_holding_a_planted_token_is_refused_unchanged(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    (run / "admin.token").write_text("planted")
    with pytest.raises(RuntimeDirError, match="open to others"):
        RuntimeDir(str(run)).create()
    assert mode(run) == 0o777 and (run / "admin.token").read_text() == "planted"


def test_open_but_empty_dir_is_made_private(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    RuntimeDir(str(run)).create()
    assert mode(run) == 0o700


@pytest.mark.parametrize("where", ["logs", "logs/j1.log", "checkpoints/j1.ckpt", "admin.token"])
def test_symlink_anywhere_in_the_tree_is_refused(tmp_path, where):
    rd = RuntimeDir(str(tmp_path / "run"))
    rd.create()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = tmp_path / "run" / where
    if path.is_dir():
        os.rmdir(path)
    path.symlink_to(elsewhere / "x")
    with pytest.raises(RuntimeDirError, match="is a symlink"):
        rd.create()
    assert os.listdir(elsewhere) == []


def test_writes_never_follow_a_symlink(tmp_path):
    rd = RuntimeDir(str(tmp_path / "run"))
    rd.create()
    target = tmp_path / "other-users-file"
    target.write_text("theirs")
    os.symlink(target, rd.log_file("j9"))
    with pytest.raises(OSError):
        rd.open_private(rd.log_file("j9"), append=True)
    os.symlink(target, rd.admin_token_file)
    with pytest.raises(OSError):
        rd.admin_token()
    assert target.read_text() == "theirs"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a file owned by another user")
def test_file_of_another_user_is_refused(tmp_path):
    rd = RuntimeDir(str(tmp_path / "run"))
    rd.create()
    planted = tmp_path / "run" / "logs" / "j1.log"
    planted.write_text("x")
    os.chown(planted, 65534, 65534)
    with pytest.raises(RuntimeDirError, match="owned by uid 65534"):
        rd.create()


@pytest.mark.parametrize("name,needle", [("y" * 120, "over the 107 a Unix socket allows"),
                                         (os.fsdecode(b"\xff\xfe"), "not UTF-8")])
def test_a_directory_whose_socket_zeromq_cannot_bind_is_refused_before_anything_is_made(tmp_path, name, needle):
    """It used to be made (with the database and the admin token) and then fail in ZeroMQ with a traceback."""
    rd = RuntimeDir(str(tmp_path / "parent" / name))
    with pytest.raises(RuntimeDirError, match=needle):
        rd.create()
    assert not (tmp_path / "parent").exists()
