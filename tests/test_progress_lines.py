"""The trainer's messages above its progress bar are printed as given (pacs_fast.trainer.metrics.Progress):
rich read them as markup, so ``train.loggers=[tensorboard,wandb]`` lost its list and ``[/tmp/x]`` raised a
MarkupError, and a redirected run's log wrapped every message at 80 columns (the README promises one line)."""
from pacs_fast.trainer.metrics import Progress


def test_messages_keep_their_brackets_and_stay_on_one_line(capsys):
    lines = ["warning: train.loggers=[tensorboard,wandb] " + "x" * 150,
             "checkpoint written to [/tmp/x] and [red]not red[/red]",
             "other processes keep 1.1 of this machine's CPUs busy: 1 torch thread(s) (train.threads sets them)"]
    progress = Progress(3, enabled=True)
    try:
        for line in lines:
            progress.print(line)
    finally:
        progress.close()
    out = capsys.readouterr().out.splitlines()
    for line in lines:
        assert line in out, (line, out)
