"""Adapters for training frameworks, one module each; none is imported here.

    mixer.integrations.hf           MixerTrainer: a transformers.Trainer over a mixer loader
    mixer.integrations.lightning    MixerDataModule: a LightningDataModule
    mixer.integrations.torchtitan   MixerDataLoader, build_mixer_dataloader (torchtitan)
    mixer.integrations.tensorboard  log_metrics(writer, loader, step)

Each imports its framework when it is imported itself (`pip install 'mixer[hf]'`, `[lightning]`,
`[torchtitan]`, `[tensorboard]`); `import mixer` and `import mixer.integrations` import none.
"""
