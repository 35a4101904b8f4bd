"""The gate's ``unrelated`` check in languages other than English.

A summary is refused when it shares no content word with its turns. Words were
runs of four letters or more, so a language written without spaces (Chinese,
Japanese, Thai) had each clause as one "word": a faithful paraphrase shared none
and was refused, and every compaction of such a conversation failed. Inflected
languages (Russian, German) paraphrase in other forms of the same words. These
turns and summaries are what a model would write; each language also has an
assistant's reply instead of a summary, which must still be refused.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.gate import Passed, Rejected
from core.domain.messages import ConversationMessage
from tests.support.plans import msg
from tests.unit.domain.test_gate_real_model import verdict

pytestmark = pytest.mark.unit


def turns(*texts: str) -> list[ConversationMessage]:
    return [msg(i, t, role="user" if i % 2 == 0 else "assistant") for i, t in enumerate(texts)]


ZH = turns(
    "我们的支付服务在周二晚上宕机了，订单全部失败，客户很着急。",
    "明白。请问宕机持续了多长时间？有没有错误日志？",
    "大概四十分钟，日志显示数据库连接池耗尽，重启后才恢复。",
    "建议把连接池上限调高，并给慢查询加超时，下周上线前做一次压测。",
    "好的，压测安排在周四，负责人是王磊。",
)
JA = turns(
    "先週の金曜日に決済サーバーが停止して、注文がすべて失敗しました。",
    "停止はどのくらい続きましたか？エラーログはありますか？",
    "約四十分です。ログにはデータベースの接続プールが枯渇したと出ています。",
    "接続プールの上限を増やして、遅いクエリにタイムアウトを設定しましょう。",
    "了解です。負荷テストは木曜日に田中さんが担当します。",
)
TH = turns(
    "ระบบชำระเงินล่มเมื่อคืนวันอังคาร คำสั่งซื้อทั้งหมดล้มเหลว",
    "ระบบล่มนานเท่าไร มีบันทึกข้อผิดพลาดไหม",
    "ประมาณสี่สิบนาที บันทึกบอกว่าพูลการเชื่อมต่อฐานข้อมูลเต็ม",
    "แนะนำให้เพิ่มขนาดพูลการเชื่อมต่อและตั้งเวลาหมดอายุให้คิวรีที่ช้า",
    "ตกลง ทดสอบโหลดวันพฤหัสบดี",
)
RU = turns(
    "Во вторник вечером упал платёжный сервис, все заказы завершались ошибкой.",
    "Понял. Сколько длился сбой? Есть журналы ошибок?",
    "Около сорока минут, в журналах видно, что пул соединений с базой исчерпан.",
    "Предлагаю увеличить пул соединений и задать таймауты медленным запросам.",
    "Хорошо, нагрузочное тестирование назначено на четверг.",
)
DE = turns(
    "Am Dienstagabend ist der Zahlungsdienst ausgefallen, alle Bestellungen schlugen fehl.",
    "Verstanden. Wie lange dauerte der Ausfall? Gibt es Fehlerprotokolle?",
    "Etwa vierzig Minuten, laut Protokoll war der Verbindungspool der Datenbank erschöpft.",
    "Ich schlage vor, den Verbindungspool zu vergrößern und langsame Abfragen zu begrenzen.",
    "Gut, der Lasttest ist für Donnerstag geplant.",
)

FAITHFUL = {
    "zh": (ZH, "周二支付服务宕机约四十分钟，原因是数据库连接池耗尽；决定调高连接池上限、"
               "给慢查询加超时，周四由王磊负责压测。"),
    "ja": (JA, "金曜日に決済サーバーが約四十分停止した。原因はデータベース接続プールの枯渇。"
               "上限の引き上げとタイムアウト設定を行い、木曜日に田中が負荷テストを担当する。"),
    "th": (TH, "ระบบชำระเงินล่มสี่สิบนาทีเพราะพูลการเชื่อมต่อเต็ม "
               "จะเพิ่มขนาดพูลและทดสอบโหลดวันพฤหัสบดี"),
    "ru": (RU, "Платёжный сервис упал во вторник примерно на сорок минут из-за исчерпания "
               "пула соединений; решено увеличить пул, добавить таймауты и провести "
               "нагрузочный тест в четверг."),
    "de": (DE, "Ausfall des Zahlungsdienstes am Dienstag (vierzig Minuten), Ursache: erschöpfter "
               "Verbindungspool. Pool wird vergrößert, Lasttest am Donnerstag."),
}  # fmt: skip
ASSISTANT_REPLY = {
    "zh": (ZH, "好的，我可以帮你。请告诉我你想让我做什么？"),
    "ja": (JA, "かしこまりました。ご用件をお聞かせください。"),
    "th": (TH, "ยินดีช่วยเหลือค่ะ กรุณาบอกสิ่งที่คุณต้องการ"),
    "ru": (RU, "Конечно, я готов помочь. Что именно вы хотите узнать?"),
    "de": (DE, "Gerne helfe ich Ihnen weiter. Was genau möchten Sie wissen?"),
}


@pytest.mark.parametrize("language", sorted(FAITHFUL))
def test_a_faithful_summary_in_the_conversations_language_passes(language: str) -> None:
    conversation, summary = FAITHFUL[language]
    assert verdict(summary, conversation) == Passed()


@pytest.mark.parametrize("language", sorted(ASSISTANT_REPLY))
def test_an_assistants_reply_instead_of_a_summary_is_refused(language: str) -> None:
    conversation, reply = ASSISTANT_REPLY[language]
    found = verdict(reply, conversation)
    assert isinstance(found, Rejected) and found.reason == "unrelated", found


@given(
    st.text(
        alphabet=st.one_of(
            st.characters(max_codepoint=127),
            st.sampled_from("éßçøあいう漢字語한국어กขคअआइ"),
        ),
        max_size=300,
    )
)
def test_content_words_take_a_shortcut_for_ascii_words_only(text: str) -> None:
    """An ASCII word is in neither unspaced script, so it skips both script checks
    and is kept unless common: the same words as checking every script first."""
    from core.domain import gate

    expected: set[str] = set()
    for word in gate.CONTENT_WORD.findall(text.casefold(), 0, gate.MAX_SHINGLES * 16)[
        : gate.MAX_SHINGLES
    ]:
        if gate.IDEOGRAPHIC_START.match(word):
            expected.update(
                g
                for g in gate._grams(word, 2)
                if g not in gate.COMMON_BIGRAMS and not gate.HIRAGANA_ONLY.fullmatch(g)
            )
        elif gate.ABUGIDA_START.match(word):
            expected.update(gate._grams(word, 4))
        elif word not in gate.COMMON_WORDS:
            expected.add(word)
    assert gate._content_words(text) == expected
