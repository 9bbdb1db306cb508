"""Every command follows the one CLI convention (docs/reference/cli/index.md, "CLI convention"), checked on the click tree itself.

The commands are discovered from the click group (a new command is checked without being listed here):
every data command takes ``--format`` with ``-f``, ``-o`` and ``--output`` as its names and ``--json``;
no option named ``-o``/``--output`` takes a file; files go to ``--out FILE``; every command's help
shows an example and its exit codes. Then the format is resolved the same way on every command.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from tpuctl.cli import main
from tpuctl.cli.app import cli
from tpuctl.cli.formats import FORMAT_NAMES, choose_format
from tpuctl.errors import InputError

NOT_DATA = {
    "barrier": "prints nothing on stdout (progress goes to stderr)",
    "progress": "prints `checkpoint STEP` alone, for a shell loop to compare (one line to the agent)",
    "down": "prints nothing on stdout",
    "run": "stdout is the job's",
    "logs": "prints the agent's log lines as they are",
    "completion": "prints a shell script",
    "sim down": "prints nothing on stdout",
    "sim restart": "prints nothing on stdout (progress goes to stderr)",
    "sim run": "stdout is the jobs'",
}
"""Commands whose stdout is not a document, and why; every other command is a data command."""


def walk(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from walk(command, click.Context(command, parent=ctx, info_name=name), (*path, name))
        else:
            yield " ".join((*path, name)), command


def commands() -> list[tuple[str, click.Command]]:
    return list(walk(cli, click.Context(cli, info_name="tpuctl")))


NAMES = [name for name, _ in commands()]


def test_the_walk_finds_every_command_of_tpuctl_help() -> None:
    assert {"init", "status", "env", "topology show", "mesh plan", "sim up", "sim status", "doctor", "detect"} <= set(
        NAMES
    )
    assert set(NOT_DATA) <= set(NAMES)  # no stale exemption


def help_text(name: str) -> str:
    result = CliRunner().invoke(cli, [*name.split(), "--help"], prog_name="tpuctl")
    assert result.exit_code == 0, result.output
    return result.output


def option(command: click.Command, opt: str) -> click.Parameter | None:
    return next((p for p in command.params if opt in p.opts or opt in p.secondary_opts), None)


@pytest.mark.parametrize("name", NAMES)
def test_data_commands_take_format_output_and_json(name: str) -> None:
    command = dict(commands())[name]
    if name in NOT_DATA:
        return
    fmt = option(command, "--format")
    assert fmt is not None, f"tpuctl {name} has no --format"
    assert set(FORMAT_NAMES) <= set(fmt.opts), f"tpuctl {name}: --format is not also {FORMAT_NAMES}: {fmt.opts}"
    assert fmt.metavar == "FORMAT"
    flag = option(command, "--json")
    assert isinstance(flag, click.Option) and flag.is_flag, f"tpuctl {name} has no --json flag"
    text = help_text(name)
    assert "-f, -o, --format, --output FORMAT" in text and "--json" in text


@pytest.mark.parametrize("name", NAMES)
def test_no_option_named_o_or_output_takes_a_file(name: str) -> None:
    command = dict(commands())[name]
    for opt in ("-o", "--output"):
        param = option(command, opt)
        assert param is None or param.name == "fmt", f"tpuctl {name}: {opt} is {param.name!r}, not the format"
    for param in command.params:
        if isinstance(param, click.Option) and param.metavar in ("FILE", "PATH") and param.name != "config":
            writes = any(word in (param.help or "") for word in ("Write", "write"))
            if writes:
                assert param.opts == ["--out"], f"tpuctl {name}: a file written is {param.opts}, not --out"


@pytest.mark.parametrize("name", NAMES)
def test_help_shows_an_example_and_the_exit_codes(name: str) -> None:
    text = help_text(name)
    examples = [line for line in text.splitlines() if line.strip().startswith(("tpuctl ", "eval ", "for "))]
    assert examples, f"tpuctl {name} --help shows no example"
    assert "Exit codes" in text, f"tpuctl {name} --help does not document its exit codes"


@pytest.mark.parametrize(
    ("given", "as_json", "expected"),
    [
        (None, False, "text"),
        ("json", False, "json"),
        ("JSON", False, "json"),
        (None, True, "json"),
        ("json", True, "json"),
    ],
)
def test_the_format_is_chosen_once(given: str | None, as_json: bool, expected: str) -> None:
    assert choose_format("status", given, as_json) == expected


def test_a_wrong_format_names_the_closest_and_where_files_go() -> None:
    with pytest.raises(InputError) as wrong:
        choose_format("status", "jsno", False)
    assert (wrong.value.message, wrong.value.hint) == (
        "tpuctl status: 'jsno' is not an output format",
        "did you mean 'json'? formats: text, json",
    )
    with pytest.raises(InputError) as path:
        choose_format("init", "/run/tpuctl/mapping.json", False)
    assert path.value.hint is not None and path.value.hint.endswith(
        "to write /run/tpuctl/mapping.json, use --out /run/tpuctl/mapping.json"
    )
    with pytest.raises(InputError, match="--json and --format text disagree"):
        choose_format("env", "sh", True, aliases={"sh": "text"})


def tpuctl(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``tpuctl ARGS`` in this process, through the entry point (light path, click, error reporting)."""
    with pytest.raises(SystemExit) as exited:
        main(args)
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


@pytest.mark.parametrize("name", [n for n in NAMES if n not in NOT_DATA])
def test_every_data_command_refuses_a_wrong_format_with_exit_2(name: str, capsys, tmp_path) -> None:
    state_dir = ["--state-dir", str(tmp_path)] if option(dict(commands())[name], "--state-dir") else []
    code, out, err = tpuctl([*name.split(), "-o", "jsn", *state_dir], capsys)
    assert (code, out) == (2, ""), err
    assert err.startswith(
        f"tpuctl: error: tpuctl {name}: 'jsn' is not an output format\nhint: did you mean 'json'? formats: "
    )
    assert err.endswith("\n") and "Traceback" not in err


def test_o_json_is_json_never_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["-o", "json"], ["--output", "json"], ["--output=json"], ["-ojson"], ["--json"], ["-f", "json"]):
        result = CliRunner().invoke(cli, ["topology", "show", "-a", "v4-8", *args], prog_name="tpuctl")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["schema"] == "tpuctl.topology/v2"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["status", "env"])
def test_the_light_path_refuses_a_wrong_format_as_click_does(command: str, capsys, tmp_path) -> None:
    from tpuctl.cli.app import main as click_main

    light = tpuctl([command, "--output=yaml", "--state-dir", str(tmp_path)], capsys)
    with pytest.raises(SystemExit) as exited:
        click_main([command, "--output=yaml", "--state-dir", str(tmp_path)], False)
    out, err = capsys.readouterr()
    assert light == (exited.value.code, out, err) == (2, "", err)
    assert err == f"tpuctl: error: tpuctl {command}: 'yaml' is not an output format\nhint: formats: text, json\n"


def test_env_takes_sh_as_its_text(capsys, tmp_path) -> None:
    from tpuctl.cli.light import parse

    assert parse(["env", "-f", "sh"]) == ("env", {"fmt": "text", "state_dir": None, "log_level": None})
    assert parse(["env", "-o", "json", "--state-dir", "x"]) == (
        "env",
        {"fmt": "json", "state_dir": "x", "log_level": None},
    )
    assert parse(["status", "--json"]) == ("status", {"fmt": "json", "state_dir": None, "log_level": None})


@pytest.mark.parametrize(
    ("args", "level"),
    [
        (["status"], None),
        (["-v", "status"], 20),
        (["status", "-vv"], 10),
        (["--log-level", "error", "env", "-v"], 40),  # --log-level wins over -v
        (["barrier", "step", "--log-level=DEBUG", "-q"], 10),
        (["--debug", "--verbose", "status", "--json"], 20),
    ],
)
def test_the_light_path_takes_the_log_options_anywhere(args: list[str], level: int | None, monkeypatch) -> None:
    from tpuctl.cli.light import parse

    monkeypatch.delenv("TPUCTL_LOG_LEVEL", raising=False)
    parsed = parse(args)
    assert parsed is not None and parsed[1]["log_level"] == level
    monkeypatch.setenv("TPUCTL_LOG_LEVEL", "warning")
    parsed = parse(args)
    assert parsed is not None and parsed[1]["log_level"] == (level or 30)


@pytest.mark.parametrize("name", NAMES)
def test_every_command_takes_the_log_options(name: str) -> None:
    command = dict(commands())[name]
    with_log = CliRunner().invoke(cli, [*name.split(), "--help"], prog_name="tpuctl").output
    assert option(command, "--log-level") is not None and option(command, "-v") is not None, name
    assert "--log-level LEVEL" in with_log and "-v, --verbose" in with_log


@pytest.mark.parametrize(
    "args", [["status", "--log-level", "loud"], ["topology", "show", "-a", "v4-8", "--log-level", "loud"]]
)
def test_a_wrong_log_level_is_a_usage_error_on_both_paths(args: list[str], capsys) -> None:
    code, out, err = tpuctl(args, capsys)
    assert (code, out) == (2, "")
    assert (
        err
        == "tpuctl: error: --log-level 'loud' is not a log level\nhint: levels: debug, info, warning, error, critical\n"
    )


def test_a_wrong_log_level_in_the_environment_names_the_variable(capsys, monkeypatch) -> None:
    monkeypatch.setenv("TPUCTL_LOG_LEVEL", "debgu")
    for args in (["status"], ["topology", "show", "-a", "v4-8"]):
        code, out, err = tpuctl(args, capsys)
        assert (code, out) == (2, ""), err
        assert err == "tpuctl: error: TPUCTL_LOG_LEVEL 'debgu' is not a log level\nhint: did you mean 'debug'?\n"


def test_log_levels() -> None:
    from tpuctl.loglevel import chosen_level, level_name, parse_level

    assert [parse_level(t) for t in ("debug", "INFO", "warn", "Warning", "error", "fatal", "15")] == [
        10,
        20,
        30,
        30,
        40,
        50,
        15,
    ]
    assert (
        chosen_level(None, 0, None) is None
        and chosen_level(None, 3, "error") == 10
        and chosen_level("info", 2, None) == 20
    )
    assert (level_name(10), level_name(15)) == ("debug", "15")


@pytest.mark.parametrize("command", ["status", "env"])
@pytest.mark.parametrize("given", [None, "text", "json", "JSON", "sh", "yaml"])
@pytest.mark.parametrize("as_json", [False, True])
def test_the_light_path_chooses_the_format_choose_format_does(command: str, given: str | None, as_json: bool) -> None:
    """The light path answers the common spellings itself (without loading tpuctl.cli.formats) and hands
    the rest to choose_format: either way the same format, or the same refusal."""
    from tpuctl.cli.light import ENV_ALIASES, ENV_FORMATS, parse

    args = [command, *(["--format", given] if given else []), *(["--json"] if as_json else [])]
    extra = {} if command == "status" else {"choices": ENV_FORMATS, "aliases": ENV_ALIASES}
    try:
        expected: object = choose_format(command, given, as_json, **extra)
    except InputError as exc:
        expected = exc.message
    try:
        parsed = parse(args)
        assert parsed is not None, args
        got: object = parsed[1]["fmt"]
    except InputError as exc:
        got = exc.message
    assert got == expected, args


@pytest.mark.parametrize(
    ("args", "suggested"),
    [(["statsu"], "'status'"), (["docter"], "'doctor'"), (["Init"], "'init'"), (["sim", "stauts"], "'status'"),
     (["topology", "shwo"], "'show'"), (["mesh", "plna"], "'plan'")],
)  # fmt: skip
def test_an_unknown_command_suggests_the_closest(args: list[str], suggested: str, capsys) -> None:
    # issue 24: the lazy top-level group said only "No such command 'statsu'."
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert f"Error: No such command {args[-1]!r}. Did you mean {suggested}?" in capsys.readouterr().err


def test_an_unknown_command_far_from_every_name_gets_no_guess(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["xyzzy"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Error: No such command 'xyzzy'." in err and "Did you mean" not in err


def integer_options() -> list[tuple[str, click.Parameter]]:
    """Every option or argument of every command that takes an integer (click's INT or a range of it)."""
    found = []
    for name, command in commands():
        for param in command.params:
            counted = isinstance(param, click.Option) and param.count  # -v, -vv: a flag, not a value
            if isinstance(param.type, click.types.IntParamType) and not counted:
                found.append((f"{name} {param.opts[0]}", param))
    return found


def test_every_integer_option_takes_ascii_digits_only() -> None:
    # issue 24: `--task-id ١` (ARABIC-INDIC DIGIT ONE) was taken as task 1; int() reads any script's digits
    options = integer_options()
    assert {"init --task-id", "doctor --task-id", "detect --task-id", "logs --lines", "run --max-restarts"} <= {
        name for name, _ in options
    }
    for name, param in options:
        ctx = click.Context(click.Command(name))
        for text in ("\u0661", "1\u0660", "\uff11", "1_0", "\u00b9"):
            with pytest.raises(click.BadParameter, match="is not a whole number"):
                param.type.convert(text, param, ctx)
        low = getattr(param.type, "min", None) or 0
        assert param.type.convert(str(low + 1), param, ctx) == low + 1, name


def test_a_task_id_in_other_digits_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["init", "--config", "nonexistent.yaml", "--task-id", "\u0661"])
    assert exit_info.value.code == 2
    assert "Invalid value for '--task-id': '\u0661' is not a whole number (digits 0-9)" in capsys.readouterr().err
