"""`python -m lm <command>` (and `torchrun -m lm <command>`, `deepspeed --module lm <command>`): the `lm` command."""

from lm.cli.main import main

if __name__ == "__main__":
    main()
