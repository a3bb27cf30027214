"""Real chat prompts for verify on a real model: a fixed set written for this project, in the model's chat format.

    ChatPrompts(tokenizer, start) -> a prompt source for scenarios.build (the methods of RandomPrompts):
        system(length)            the next system prompt (`length` is the random prompts' and is ignored)
        tokens(lengths, system)   one chat prompt per length: the system prompt (or the model's default
                                  one, when none is given) and the next user message
        aligned(lengths, system)  the same, but only prompts whose token count is a multiple of the block size
        eos_token_id              <|im_end|>: where a scenario's requests may stop on their own

Prompts with one system prompt share its tokens, so a prefix cache hits them. The format is SmolLM2's chat
template (the GGUF's tokenizer.chat_template; a test renders it and compares):

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n
"""

from __future__ import annotations

from .bpe import ByteBPE

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the template's own

SYSTEM_PROMPTS = (
    "You are a patient tutor. Answer in one or two plain sentences.",
    "You are a concise travel guide. Give short, practical answers.",
    "You are a friendly cooking assistant. Keep every answer brief.",
)

USER_MESSAGES = (
    "What is the capital of France?",
    "Why is the sky blue?",
    "How many legs does a spider have?",
    "Name three primary colors.",
    "What does a bee make?",
    "How do I boil an egg?",
    "What is two plus two?",
    "Which planet is closest to the sun?",
    "What is the largest ocean on Earth?",
    "Give me a word that rhymes with cat.",
    "What language is spoken in Brazil?",
    "How many days are in a week?",
    "What is water made of?",
    "Who wrote Romeo and Juliet?",
    "What is the opposite of hot?",
    "Suggest a name for a small grey cat.",
    "What should I pack for a day at the beach?",
    "How long does it take to bake bread?",
    "What is the tallest mountain in the world?",
    "Tell me a fun fact about octopuses.",
    "What is a good breakfast before a long walk?",
    "Which season comes after winter?",
    "What do plants need to grow?",
    "How do you say hello in Spanish?",
)


def chat_text(system: str, user: str) -> str:
    """One user turn in SmolLM2's chat format, ending where the assistant's answer starts."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


class ChatPrompts:
    """A scenario's prompt source over the fixed chat prompts (see the module docstring); `start` picks
    where in the list of user messages this scenario begins, so scenarios ask different questions."""

    def __init__(self, tokenizer: ByteBPE, start: int = 0, block_size: int = 4) -> None:
        self.tokenizer, self.block_size = tokenizer, block_size
        self.eos_token_id = tokenizer.control["<|im_end|>"]
        self._next_user, self._next_system = start, start
        self.texts: dict[tuple[int, ...], str] = {}  # prompt token ids -> its text (for reports)

    def system(self, length: int) -> str:
        prompt = SYSTEM_PROMPTS[self._next_system % len(SYSTEM_PROMPTS)]
        self._next_system += 1
        return prompt

    def _user(self) -> str:
        message = USER_MESSAGES[self._next_user % len(USER_MESSAGES)]
        self._next_user += 1
        return message

    def _prompt(self, system: str, user: str) -> tuple[int, ...]:
        text = chat_text(system or DEFAULT_SYSTEM, user)
        ids = tuple(self.tokenizer.encode(text))
        self.texts[ids] = text
        return ids

    def tokens(self, lengths: list[int], system: str = "") -> list[tuple[int, ...]]:
        return [self._prompt(system, self._user()) for _ in lengths]

    def aligned(self, lengths: list[int], system: str = "") -> list[tuple[int, ...]]:
        prompts: list[tuple[int, ...]] = []
        for _ in range(len(USER_MESSAGES)):
            if len(prompts) == len(lengths):
                return prompts
            prompt = self._prompt(system, self._user())
            if len(prompt) % self.block_size == 0:
                prompts.append(prompt)
        raise ValueError(f"fewer than {len(lengths)} chat prompts are a multiple of {self.block_size} tokens long")
