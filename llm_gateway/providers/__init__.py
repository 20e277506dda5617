"""Providers as translators: one per provider profile (envoyproxy/ai-gateway's pattern).

A profile holds everything one kind of provider does its own way: how it reports usage and
cost, how its errors look, and (with routing) which parameters it spells differently. The
engine asks the profile and never tests for a provider by name.
"""

from __future__ import annotations

from llm_gateway.providers.anthropic import AnthropicProfile
from llm_gateway.providers.base import PROTOCOLS, Profile, Usage
from llm_gateway.providers.gemini import GeminiProfile
from llm_gateway.providers.generic import GenericProfile
from llm_gateway.providers.openai import OpenAIProfile, UnsupportedParameter
from llm_gateway.providers.venice import VeniceProfile

PROFILES: dict[str, Profile] = {
    profile.name: profile for profile in (OpenAIProfile(), VeniceProfile(), GenericProfile(),
                                          AnthropicProfile(), GeminiProfile())
}


def profile_named(name: str) -> Profile:
    """The profile called ``name``; KeyError names the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown provider profile {name!r}; known: {', '.join(PROFILES)}") from None


__all__ = [
    "PROFILES", "PROTOCOLS", "AnthropicProfile", "GeminiProfile", "GenericProfile", "OpenAIProfile",
    "Profile",
    "UnsupportedParameter", "Usage", "VeniceProfile", "profile_named",
]
