"""DistillSpec-style training of a draft model on a frozen teacher."""

import shutil

import pytest

from specjax.decoding.drafters.draft_model import DraftModel
from specjax.decoding.shapes.chain import Chain
from specjax.io.checkpoint import Checkpointer, CheckpointError, load_params
from specjax.loading import load_model
from specjax.training.frozen_base import load_base
from specjax.training.train_step import TrainState
from specjax.training.trainer import Trainer
from tests.support.models import tiny_run
from tests.training.test_token_cache import write_bpe_tokenizer

pytestmark = pytest.mark.slow  # the fast subset (-m 'not slow') leaves this file out

TEACHER_RUN = tiny_run(model=dict(init_std=0.3),
                       train=dict(total_steps=4, warmup_steps=1, eval_every=4, save_every=4))


def student_run(teacher, **model):
    run = tiny_run(model=dict(num_layers=2, exit_layers=(2,), **model),
                   train=dict(total_steps=20, learning_rate=1e-2, eval_every=20,
                              save_every=20))
    run["distill"] = {"teacher_workdir": teacher}
    return run


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("teacher"))
    Trainer(TEACHER_RUN, path).fit()
    return path


def test_a_distilled_draft_model_learns_the_teacher_and_drafts_for_it(teacher, tmp_path):
    """Catches a student trained on the corpus' tokens instead of the teacher's distribution
    (the same model trained on the tokens ends farther from the teacher), a teacher changed
    by training, and a distilled workdir that does not load as a draft model."""
    before = load_base(teacher).checksum
    trainer = Trainer(student_run(teacher), str(tmp_path / "distilled"))
    untrained = trainer.objective.evaluate(trainer.fresh_state(), trainer.eval_batches)
    report = trainer.fit().report
    assert report.soft_ce < untrained.soft_ce - 0.2
    assert report.agreement > untrained.agreement + 0.05
    on_tokens = {**student_run(teacher), "distill": {"teacher_workdir": ""}}
    Trainer(on_tokens, str(tmp_path / "on_tokens")).fit()
    plain = trainer.objective.evaluate(
        TrainState(step=0, params=load_params(str(tmp_path / "on_tokens"))[0], opt_state=None),
        trainer.eval_batches)
    assert report.soft_ce < plain.soft_ce
    assert load_base(teacher).checksum == before
    meta = Checkpointer(str(tmp_path / "distilled")).read_meta()
    assert meta["objective"] == "distill" and meta["teacher"]["checksum"] == before
    loaded = load_model(teacher, draft_workdir=str(tmp_path / "distilled"))
    generator = loaded.generator()
    prompts = [[1, 2, 3], [40, 41]]
    plain = generator.generate(prompts, max_new_tokens=12)
    drafted = generator.generate(prompts, max_new_tokens=12, strategy=DraftModel(Chain(3)))
    assert drafted.tokens == plain.tokens and drafted.total.accepted > 0


def test_a_changed_teacher_or_another_vocabulary_is_refused(teacher, tmp_path):
    moved = str(tmp_path / "teacher")
    shutil.copytree(teacher, moved)
    student = str(tmp_path / "student")
    Trainer({**student_run(moved), "train": {**student_run(moved)["train"], "total_steps": 3,
                                             "warmup_steps": 1}}, student).fit()
    assert load_params(student)[1].num_layers == 2  # an ordinary model's workdir
    shutil.rmtree(moved)
    Trainer(tiny_run(model=dict(init_std=0.3), train={**TEACHER_RUN["train"], "seed": 1}),
            moved).fit()
    with pytest.raises(CheckpointError, match="is not the one this draft model was trained on"):
        Trainer(student_run(moved), student).fit()
    with pytest.raises(ValueError, match="a draft model must share them"):
        Trainer(student_run(teacher, vocab_size=300), str(tmp_path / "other")).fit()


def test_a_teacher_with_another_tokenizer_of_the_same_size_is_refused(teacher, tmp_path):
    """A student whose data is encoded by a BPE tokenizer.json, with the teacher's 259-id
    vocabulary but not its byte tokenizer, is refused before training ("must share"): its
    ids name other text than the teacher's. Catches the tokenizer fingerprints left
    uncompared (only the vocabulary sizes checked: the student distilled on ids that mean
    other tokens to the teacher)."""
    bpe = write_bpe_tokenizer(str(tmp_path / "bpe"), vocab_size=259)
    assert bpe.fingerprint() != "bytes" and bpe.vocab_size <= 259
    run = student_run(teacher)
    run = {**run, "data": {**run["data"], "tokenizer": str(tmp_path / "bpe")},
           "train": {**run["train"], "total_steps": 3, "warmup_steps": 1, "eval_every": 3,
                     "save_every": 3}}
    workdir = tmp_path / "student"
    with pytest.raises(ValueError, match=r"tokenizer 'bytes' with 259 ids, this model .*bpe' "
                                         r"with 259: a draft model must share them"):
        Trainer(run, str(workdir)).fit()
    assert not (workdir / "checkpoints").exists()
