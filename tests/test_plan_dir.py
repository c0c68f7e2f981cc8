"""A session's compiled plans kept on disk (`Session(plan_dir=...)`): a second session, another process
say, reads them instead of compiling, gets the same tokens, and a damaged or stale file is compiled anew."""

from __future__ import annotations

import numpy as np

from turnip import Session

PROMPTS = [np.arange(1, 12) % 200, np.arange(5, 9) % 200]


def _generate(plan_dir, memory=100 << 10):
    with Session(config="tiny-gqa", memory=memory, backend="cpu", kv_block=16, plan_dir=plan_dir) as session:
        result = session.generate(PROMPTS, 5)
        return result, session.compiles, session.disk_hits


def test_a_second_session_reads_the_plans_instead_of_compiling(tmp_path):
    first, compiled, hits = _generate(tmp_path)
    files = sorted(tmp_path.glob("*.json"))
    assert compiled > 0 and hits == 0 and len(files) == compiled
    second, compiled_again, hits_again = _generate(tmp_path)
    assert compiled_again == 0 and hits_again == compiled
    np.testing.assert_array_equal(second.tokens, first.tokens)
    assert not list(tmp_path.glob("*.tmp"))  # written whole or not at all


def test_a_damaged_plan_file_is_compiled_anew(tmp_path):
    first, compiled, _ = _generate(tmp_path)
    victim = sorted(tmp_path.glob("*.json"))[0]
    victim.write_text(victim.read_text()[: len(victim.read_text()) // 2])  # cut short
    second, compiled_again, hits = _generate(tmp_path)
    assert compiled_again == 1 and hits == compiled - 1
    np.testing.assert_array_equal(second.tokens, first.tokens)
    _, compiled_third, _ = _generate(tmp_path)
    assert compiled_third == 0  # the file was written anew


def test_another_budget_is_another_plan(tmp_path):
    _, compiled, _ = _generate(tmp_path)
    _, compiled_other, hits = _generate(tmp_path, memory=1 << 20)
    assert compiled_other > 0 and hits == 0
    assert len(list(tmp_path.glob("*.json"))) == compiled + compiled_other


def test_turnip_generate_plan_dir_reads_plans_in_a_later_run(tmp_path, capsys):
    from turnip_cli.main import main

    args = ["generate", "--config", "tiny", "--prompt-tokens", "6", "--batch", "2", "--max-new-tokens", "3",
            "--memory", "100KiB", "--backend", "cpu", "--plan-dir", str(tmp_path / "plans")]
    outputs = []
    for run in range(2):
        out = tmp_path / f"gen{run}.npz"
        assert main([*args, "--outputs", str(out)]) == 0
        outputs.append(np.load(out)["generated"])
    printed = capsys.readouterr().out
    assert "plan(s) read from --plan-dir" in printed.split("compiled")[-1] and "compiled 0 graph(s)" in printed
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_turnip_generate_refuses_a_plan_dir_that_is_a_file(tmp_path, capsys):
    from turnip_cli.main import main

    blocker = tmp_path / "plans"
    blocker.write_text("")
    code = main(["generate", "--config", "tiny", "--prompt-tokens", "6", "--max-new-tokens", "3", "--memory", "100KiB",
                 "--backend", "cpu", "--plan-dir", str(blocker), "--outputs", str(tmp_path / "g.npz")])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "plan folder" in err and str(blocker) in err
    assert not (tmp_path / "g.npz").exists()
