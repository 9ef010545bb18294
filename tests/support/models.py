"""Models derived from the test models."""
import shutil

import torch
from safetensors.torch import load_file, save_file


def perturbed_copy(model_dir, path, noise: float):
    """The model with every weight moved by `noise` times its tensor's spread: a draft that often agrees."""
    shutil.copytree(model_dir, path)
    generator = torch.Generator().manual_seed(0)
    for file in path.glob("*.safetensors"):
        tensors = load_file(file)
        for name, tensor in tensors.items():
            spread = tensor.float().std() if tensor.numel() > 1 else tensor.float().abs()
            tensors[name] = tensor + noise * spread * torch.randn(tensor.shape, generator=generator)
        save_file(tensors, file, metadata={"format": "pt"})
    return path
