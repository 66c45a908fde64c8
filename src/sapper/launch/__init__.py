"""``sapper run -- <launch command>``: one run guarded from start to finish.

Before the launch, the command is read (:mod:`sapper.launch.command`) and its plan goes
through ``sapper check``'s checklist (:mod:`sapper.launch.preflight`); an error stops the
launch. The command then runs unchanged under a supervisor (:mod:`sapper.launch.supervise`)
that tees its console, forwards signals and watches the run logs for a hang, while a
bootstrap on the children's import path (``site/``) attaches the monitor. Everything about
the run lands in one folder (:mod:`sapper.launch.folder`), the end is analyzed with the
post-mortem pipeline, and the outcome is kept in the ledger (:mod:`sapper.launch.ledger`).
"""
