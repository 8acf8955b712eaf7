"""`tf_ecrec.base.process_end.end_process` in a real process: what a normal exit would clean up is cleaned up."""

import json
import os
import subprocess
import sys

CONVERT_THEN_END = """
import json, sys
import tensorflow as tf

def f(x):
    if x > 0:
        return x + 1
    return x

tf.autograph.to_graph(f)  # autograph writes the converted code to a temp file, removed at exit
files = [m.__file__ for n, m in sys.modules.items() if n.startswith("__autograph_generated_file")]
print(json.dumps(files), flush=True)
if sys.argv[1] == "end_process":
    from tf_ecrec.base.process_end import end_process
    end_process(0)
import os
os._exit(0)
"""


def _files_left(tmp_path, how: str) -> list[str]:
    script = tmp_path / "convert_then_end.py"  # autograph reads a function's source: not from "python -c"
    script.write_text(CONVERT_THEN_END)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(done.stdout.strip().splitlines()[-1])
    assert files, "autograph converted nothing"
    return [f for f in files if os.path.exists(f)]


def test_a_process_ended_by_end_process_leaves_no_autograph_file_behind(tmp_path):
    assert _files_left(tmp_path, "end_process") == []


def test_the_check_sees_the_files_a_bare_os_exit_leaves(tmp_path):
    left = _files_left(tmp_path, "os._exit")
    for path in left:
        os.remove(path)
    assert left
