"""trim_compile_log: compiler logs become short, precise LLM feedback."""

from __future__ import annotations

from cudal1.raw_cuda.errors import MAX_LOG_CHARS, MAX_LOG_LINES, trim_compile_log

NVRTC_LOG = """kernel.cu(3): error: expected a ";"
    y[i] = z;
    ^

kernel.cu(2): warning #177-D: variable "i" was declared but never referenced
    int i = threadIdx.x
        ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

kernel.cu(4): error: a value of type "double" cannot be used to initialize an entity of type "float *"
    float* p = 3.0;
               ^

2 errors detected in the compilation of "kernel.cu".
"""


def test_keeps_errors_with_excerpt_and_drops_warnings():
    out = trim_compile_log(NVRTC_LOG)
    assert out.splitlines() == [
        'kernel.cu(3): error: expected a ";"',
        "    y[i] = z;",
        "    ^",
        'kernel.cu(4): error: a value of type "double" cannot be used to initialize an entity of type "float *"',
        "    float* p = 3.0;",
        "               ^",
        '2 errors detected in the compilation of "kernel.cu".',
    ]
    assert "warning" not in out and "Remark" not in out


def test_long_log_is_capped_and_counts_what_it_left_out():
    block = 'kernel.cu({n}): error: identifier "v{n}" is undefined\n    x = v{n};\n        ^\n\n'
    log = "".join(block.format(n=n) for n in range(1, 201)) + "200 errors detected in the compilation.\n"
    out = trim_compile_log(log)
    lines = out.splitlines()
    assert len(lines) <= MAX_LOG_LINES and len(out) <= MAX_LOG_CHARS
    assert lines[0] == 'kernel.cu(1): error: identifier "v1" is undefined'
    assert lines[-1].startswith("... ") and "more error(s) not shown" in lines[-1]
    assert int(lines[-1].split()[1]) == 200 - sum(1 for ln in lines if ": error:" in ln)


def test_char_cap_applies_to_very_long_lines():
    log = "kernel.cu(1): error: " + "x" * 5000 + "\n"
    assert len(trim_compile_log(log)) <= MAX_LOG_CHARS


def test_tool_and_gcc_style_errors_are_recognized():
    log = ("ptxas info    : 0 bytes gmem\nptxas error   : Entry function 'k' uses too much shared data "
           "(0x20000 bytes, 0xc000 max)\nnvrtc: error: unrecognized option --bogus found\n"
           "kernel.cu:4:5: error: 'z' was not declared in this scope\nkernel.cu:4:5: note: something\n")
    out = trim_compile_log(log).splitlines()
    assert out[0].startswith("ptxas error")
    assert out[1].startswith("nvrtc: error: unrecognized option")
    assert out[2].startswith("kernel.cu:4:5: error:")
    assert not any("info" in ln or "note" in ln for ln in out)


def test_catastrophic_error_kept():
    log = ('kernel.cu(1): catastrophic error: cannot open source file "torch/extension.h"\n'
           "  #include <torch/extension.h>\n                             ^\n\n"
           '1 catastrophic error detected in the compilation of "kernel.cu".\nCompilation terminated.\n')
    out = trim_compile_log(log)
    assert out.startswith('kernel.cu(1): catastrophic error: cannot open source file "torch/extension.h"')
    assert "Compilation terminated" not in out


def test_unrecognized_log_falls_back_to_first_lines():
    log = "\n".join(f"line {i}" for i in range(100)) + "\x00"
    out = trim_compile_log(log)
    assert out.splitlines()[0] == "line 0" and len(out.splitlines()) == MAX_LOG_LINES
