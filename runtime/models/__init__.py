"""Model implementations, chosen by the checkpoint's architecture name (`registry.MODEL_CLASSES`).

Nothing is imported here: `models.config` is read by the API process, which never imports torch.
"""
