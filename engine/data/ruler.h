// RULER's 13 synthetic tasks (Hsieh et al. 2024), generated locally from a seed (no
// downloads), each scored by exact match of the generated answer:
//   niah_single      one "special magic number" for a key hidden in noise (RULER's niah_single_1)
//   niah_single_2    the same in essay-like prose (RULER: Paul Graham essays, an external set)
//   niah_single_3    essay prose, the value a uuid
//   niah_multikey    several keys with numbers in noise; asked for one key's number (niah_multikey_1)
//   niah_multikey_2  one needle in a haystack of other needles (word-word keys, numbers)
//   niah_multikey_3  the same with uuid keys and uuid values
//   niah_multivalue  one key with several numbers scattered in the filler; asked for all of them
//   niah_multiquery  several keys with numbers in essay prose; asked for up to 4 at once
//   vt               variable tracking: VAR X = n, then chains VAR Y = VAR X; asked which
//                    variables hold n (answer in order of assignment)
//   cwe              common words extraction: a list of words where a few occur far more often;
//                    asked for the most common ones (in order of first appearance)
//   fwe              frequent words extraction: coded words with Zipf (alpha 2) frequencies;
//                    asked for the three most frequent (most frequent first)
//   qa_1, qa_2       documents about invented towns, people and rivers (RULER reads SQuAD and
//                    HotpotQA, external sets whose facts a model may also know by heart); qa_1
//                    asks one document's fact, qa_2 a fact two documents give together
// The prompt is wrapped in the model's chat template when the caller gives one and the
// tokenizer has it (ChatML, Llama 3), else ends with "Answer:"; either way the answer's first
// words follow (RULER's answer prefix, e.g. "The special magic number for walnut mentioned in
// the provided text is"). The sample ends with the answer's tokens, so one
// teacher-forced pass scores a greedy continuation: it reproduces the answer exactly iff the
// argmax at every answer position is the answer's token (the repeat task's argument).
// Several questions of one context (SCBench's multi-request; RulerSpec::questions): the tasks
// whose context holds several keys ask about different ones (niah_multikey: one key each,
// niah_multiquery: up to 4 keys each), every question followed by its own answer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

// The task names, in display order (the --data choices that are RULER tasks).
const std::vector<std::string>& ruler_task_names();
bool is_ruler_task(const std::string& name);
// The tasks that can ask several questions of one context (RulerSpec::questions > 1).
const std::vector<std::string>& ruler_multi_question_tasks();

struct RulerSpec {
    std::string task = "niah_single";
    int64_t seq_length = 2048;  // total tokens including the answer
    uint64_t seed = 1234;
    int64_t num_keys = 4;       // niah_multikey/multiquery: keys in the context; niah_multivalue: values; vt: chain length; cwe: common words
    // Questions asked of each context (ruler_multi_question_tasks(); 1 elsewhere). niah_multikey
    // then hides max(num_keys, questions) keys and asks each question about another one. The
    // sample's length counts the first question only.
    int64_t questions = 1;
    // Where the needle goes, in [0, 1] of the haystack (0: its start, 1: right before the
    // question), for the needle-in-a-haystack grid of depth x length; < 0: a random depth in
    // [0.05, 0.95] as RULER draws it. Only for tasks hiding one sentence (niah_single*,
    // niah_multikey_2/3); make_ruler_sample throws naming --data.depths for the others.
    double depth = -1;
    // The model's chat template around a user message (engine/generate's chat_prompt, passed
    // down by the caller: data sits below generate). Empty, or throwing kv::Error for a
    // tokenizer without one: the plain frame ending in "Answer:".
    std::function<std::string(const std::string& user)> chat;
    // With `chat`: what closes the assistant's turn (ChatML "<|im_end|>\n"), so that a
    // conversation's later questions can open user turns of their own (RulerQuestion::turn_open).
    std::function<std::string()> chat_turn_end;
};

// A further question of a sample's context: it replaces ids[question_start, end) of the sample.
struct RulerQuestion {
    std::vector<int32_t> ids;   // the question (with the frame's close and the answer's first words), then the answer
    int64_t answer_length = 0;  // tokens of the answer (the last ones of ids)
    // Asked after the model's answer in a conversation (--data.turns multi-turn), the question
    // comes after these tokens: the assistant's turn closed and a user turn opened, as the chat
    // template frames a second message (empty without a chat frame: the plain frame's question
    // follows the answer directly). Multi-request questions replace the first one inside the
    // user's turn and take no such tokens.
    std::vector<int32_t> turn_open;
    std::string answer;
};

struct RulerSample {
    std::vector<int32_t> ids;        // prompt then answer tokens
    int64_t answer_start = 0;        // position of the answer's first token
    // Position of the question's first token: [0, question_start) is the context (BOS, the
    // frame's opening, instruction and haystack), [question_start, answer_start) the question
    // with the frame's close and the answer's first words (compress-then-ask compresses only
    // the context).
    int64_t question_start = 0;
    int64_t answer_length = 0;       // tokens of the answer (the last ones of ids)
    std::string answer;              // the answer text
    std::string description;         // e.g. "niah_single key 'walnut' at depth 0.37"
    // Questions 2.. of the context (RulerSpec::questions - 1 of them; empty for one question).
    std::vector<RulerQuestion> more_questions;
    // Positions t whose next token ids[t + 1] is scored: answer_start - 1 .. answer_start + answer_length - 2.
    int64_t first_scored_input() const { return answer_start - 1; }
};

// RULER's metric of a generated answer text against the sample's answer: the share of the
// answer's items (split at ", ", at " " for vt) found in the prediction, case-insensitively
// (string_match_all); qa_1 and qa_2: 1 when the answer occurs in it at all (string_match_part).
double ruler_text_score(const std::string& task, const std::string& prediction, const std::string& answer);

// Throws kv::Error naming --data.seq_length when the task does not fit, --data for an
// unknown task, or --data.questions when the task asks one question only. Deterministic per (spec, index).
RulerSample make_ruler_sample(const RulerSpec& spec, int64_t index, const Tokenizer& tok);

}  // namespace kv
