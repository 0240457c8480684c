"""Runs many fact scripts (``facts.hostpy.PythonJob``) in one interpreter.

argv: MARK, then per job OUT_PATH KEY FACT_NAME SOURCE N and the job's N arguments. Each job runs
as `python -c SOURCE ARGS...` would (its own globals, sys.argv, stdout and stderr; sys.path put
back after it) and its section is written to OUT_PATH in the probe's format: begin line, stdout,
a newline, stderr lines, end line.
"""

import io
import sys

MARK = sys.argv[1]
def run(out_path, key, name, source, argv):
    saved = sys.argv, sys.stdout, sys.stderr, list(sys.path)
    out, err = io.StringIO(), io.StringIO()
    sys.argv, sys.stdout, sys.stderr = ["-c", *argv], out, err
    rc = 0
    try:
        exec(compile(source, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=err)
    except BaseException:
        import traceback
        kind, value, tb = sys.exc_info()
        traceback.print_exception(kind, value, tb.tb_next, file=err)  # not the runner's frame
        rc = 1
    finally:
        sys.argv, sys.stdout, sys.stderr = saved[:3]
        sys.path[:] = saved[3]
    lines = [MARK + "-begin " + key + " " + name, out.getvalue()]
    lines += [MARK + "-stderr " + line for line in err.getvalue().splitlines()]
    lines.append(MARK + "-end " + key + " " + str(rc))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
args = sys.argv[2:]
while args:
    n = int(args[4])
    run(*args[:4], args[5:5 + n])
    args = args[5 + n:]
