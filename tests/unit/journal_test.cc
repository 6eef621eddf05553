// Journal: records survive a SIGKILL at any moment; torn tails are cut; runs never mix.
#include "common/journal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "attnscale/error.h"

namespace attnscale {
namespace {
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("attnscale_journal_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

// Payloads of assorted sizes and bytes, newlines and NULs included.
std::string payload(std::int64_t key) {
  std::string s = "point " + std::to_string(key) + "\n";
  for (std::int64_t i = 0; i < key % 37; ++i) s += static_cast<char>((key * 31 + i * 7) % 256);
  return s;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(Journal, RecordsRoundTrip) {
  const std::string p = temp_path("roundtrip");
  {
    Journal j = Journal::open(p, "run A", false);
    for (std::int64_t k = 0; k < 20; ++k) j.append(k, payload(k));
  }
  Journal j = Journal::open(p, "run A", true);
  ASSERT_EQ(j.records().size(), 20u);
  EXPECT_EQ(j.recovered(), 20u);
  for (std::int64_t k = 0; k < 20; ++k) EXPECT_EQ(j.records().at(k), payload(k));
  j.remove();
  EXPECT_FALSE(fs::exists(p));
}

TEST(Journal, WithoutResumeStartsOver) {
  const std::string p = temp_path("fresh");
  Journal::open(p, "run A", false).append(1, "x");
  Journal j = Journal::open(p, "run A", false);
  EXPECT_TRUE(j.records().empty());
  j.remove();
}

TEST(Journal, TornTailIsCutAndAppendsContinue) {
  const std::string p = temp_path("torn");
  { Journal j = Journal::open(p, "h", false); for (int k = 0; k < 5; ++k) j.append(k, payload(k)); }
  const std::string whole = slurp(p);
  // Every possible torn length of a sixth record, and garbage, must recover the five intact ones.
  std::string sixth;
  {
    const std::string q = temp_path("torn_ref");
    Journal j = Journal::open(q, "h", false);
    for (int k = 0; k < 6; ++k) j.append(k, payload(k));
    sixth = slurp(q).substr(whole.size());
    j.remove();
  }
  for (std::size_t cut = 0; cut < sixth.size(); ++cut) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << whole << sixth.substr(0, cut);
    Journal j = Journal::open(p, "h", true);
    ASSERT_EQ(j.records().size(), 5u) << "cut at " << cut;
    j.append(5, payload(5));
    EXPECT_EQ(slurp(p), whole + sixth) << "cut at " << cut;
  }
  std::ofstream(p, std::ios::binary | std::ios::trunc) << whole << "R 5 3 00000000000000ff\nabc\n";
  EXPECT_EQ(Journal::open(p, "h", true).records().size(), 5u);  // checksum mismatch
  fs::remove(p);
}

TEST(Journal, DifferentRunOrForeignFileIsAnError) {
  const std::string p = temp_path("other");
  Journal::open(p, "saturation seed=1", false).append(0, "rows");
  try {
    Journal::open(p, "saturation seed=2", true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to a different run (saturation seed=1)"), std::string::npos);
  }
  std::ofstream(p, std::ios::binary | std::ios::trunc) << "n,d,metric\n1,2,x\n";
  EXPECT_THROW(Journal::open(p, "saturation seed=1", true), Error);
  fs::remove(p);
}

// One garbled byte inside an early record (its payload, or its record line) loses that record only:
// every intact record after it is kept, and the damage is counted, not silent.
TEST(Journal, DamagedRecordInTheMiddleKeepsEveryIntactRecord) {
  const std::string p = temp_path("damaged");
  { Journal j = Journal::open(p, "h", false); for (int k = 0; k < 6; ++k) j.append(k, payload(k)); }
  const std::string whole = slurp(p);
  const std::size_t r1 = whole.find("R 1 "), r3 = whole.find("R 3 ");
  ASSERT_NE(r1, std::string::npos);
  ASSERT_NE(r3, std::string::npos);
  std::string garbled = whole;
  garbled[whole.find('\n', r1) + 3] ^= 0x20;  // inside record 1's payload: its checksum fails
  garbled[r3 + 4] = 'x';                        // record 3's length: its line no longer reads
  std::ofstream(p, std::ios::binary | std::ios::trunc) << garbled;
  {
    Journal j = Journal::open(p, "h", true);
    EXPECT_EQ(j.damaged(), 2u);
    ASSERT_EQ(j.records().size(), 4u);
    for (int k : {0, 2, 4, 5}) EXPECT_EQ(j.records().at(k), payload(k)) << k;
    j.append(1, payload(1));  // run again
    j.append(3, payload(3));
  }
  Journal j = Journal::open(p, "h", true);
  EXPECT_EQ(j.records().size(), 6u);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(j.records().at(k), payload(k)) << k;
  // A complete last record with a bad checksum is damage too; a torn one (incomplete) is not.
  std::ofstream(p, std::ios::binary | std::ios::trunc) << whole << "R 6 3 00000000000000ff\nabc\n";
  EXPECT_EQ(Journal::open(p, "h", true).damaged(), 1u);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << whole << "R 6 300 00000000000000ff\nabc";
  EXPECT_EQ(Journal::open(p, "h", true).damaged(), 0u);
  fs::remove(p);
}

// A record's checksum covers its key: a garbled key is one damaged record, never another record
// (here record 4 turned into a second record 2, which would have replaced record 2's rows).
TEST(Journal, AGarbledKeyIsDamageNotAnotherRecord) {
  const std::string p = temp_path("garbled_key");
  { Journal j = Journal::open(p, "h", false); for (int k = 0; k < 6; ++k) j.append(k, payload(k)); }
  std::string garbled = slurp(p);
  garbled[garbled.find("R 4 ") + 2] = '2';
  std::ofstream(p, std::ios::binary | std::ios::trunc) << garbled;
  Journal j = Journal::open(p, "h", true);
  EXPECT_EQ(j.damaged(), 1u);
  ASSERT_EQ(j.records().size(), 5u);
  EXPECT_EQ(j.records().count(4), 0u);
  for (int k : {0, 1, 2, 3, 5}) EXPECT_EQ(j.records().at(k), payload(k)) << k;
  j.remove();
}

// A resume that skipped a damaged record rewrites the journal without it: the next resume finds
// every intact record and nothing damaged, so the warning is given once. The rewritten file is
// the one a run that never met the damage would have left.
TEST(Journal, ADamagedRecordIsMetByOneResumeOnly) {
  const std::string p = temp_path("met_once"), clean = temp_path("met_once_clean");
  { Journal j = Journal::open(p, "h", false); for (int k = 0; k < 6; ++k) j.append(k, payload(k)); }
  {
    Journal j = Journal::open(clean, "h", false);
    for (int k : {0, 2, 3, 4, 5}) j.append(k, payload(k));
  }
  std::string garbled = slurp(p);
  garbled[garbled.find('\n', garbled.find("R 1 ")) + 3] ^= 0x20;  // inside record 1's payload
  std::ofstream(p, std::ios::binary | std::ios::trunc) << garbled;
  EXPECT_EQ(Journal::open(p, "h", true).damaged(), 1u);
  EXPECT_EQ(slurp(p), slurp(clean));
  for (int resume = 0; resume < 2; ++resume) {
    Journal j = Journal::open(p, "h", true);
    EXPECT_EQ(j.damaged(), 0u);
    EXPECT_EQ(j.records().size(), 5u);
  }
  Journal::open(p, "h", true).append(1, payload(1));  // appends go on after the rewrite
  Journal j = Journal::open(p, "h", true);
  ASSERT_EQ(j.records().size(), 6u);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(j.records().at(k), payload(k)) << k;
  for (const auto& entry : fs::directory_iterator(fs::path(p).parent_path()))  // no temporary left
    EXPECT_NE(entry.path().filename().string().rfind(fs::path(p).filename().string() + ".", 0), 0u) << entry.path();
  j.remove();
  fs::remove(clean);
}

// A journal of version 1 (records' checksums over the payload alone, written by earlier releases)
// is resumed: its records are kept and the file is rewritten as version 2, where appends go on.
TEST(Journal, AVersionOneJournalIsResumedAndRewritten) {
  const std::string p = temp_path("version1");
  const auto frame = [](const std::string& head, const std::string& body) {
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(fnv1a64(body)));
    return head + std::to_string(body.size()) + " " + sum + "\n" + body + "\n";
  };
  std::string v1 = "attnscale-journal 1\n" + frame("H ", "run A");
  for (int k = 0; k < 4; ++k) v1 += frame("R " + std::to_string(k) + " ", payload(k));
  std::ofstream(p, std::ios::binary | std::ios::trunc) << v1;
  {
    Journal j = Journal::open(p, "run A", true);
    EXPECT_EQ(j.damaged(), 0u);
    ASSERT_EQ(j.records().size(), 4u);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(j.records().at(k), payload(k)) << k;
    EXPECT_EQ(slurp(p).rfind("attnscale-journal 2\n", 0), 0u);
    j.append(4, payload(4));
  }
  Journal j = Journal::open(p, "run A", true);
  ASSERT_EQ(j.records().size(), 5u);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(j.records().at(k), payload(k)) << k;
  j.remove();
}

// A child appends records as fast as it can and is killed with SIGKILL midway; the journal it
// leaves holds an intact prefix, and finishing from it gives the same bytes as a run never killed.
TEST(Journal, SurvivesSigkillMidway) {
  const std::string killed = temp_path("killed"), clean = temp_path("clean");
  constexpr std::int64_t kRecords = 400;
  {
    Journal j = Journal::open(clean, "run", false);
    for (std::int64_t k = 0; k < kRecords; ++k) j.append(k, payload(k));
  }
  const std::uintmax_t min_size = fs::file_size(clean) / 8;
  fs::remove(killed);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Journal j = Journal::open(killed, "run", false);
    for (std::int64_t k = 0; k < kRecords; ++k) {
      j.append(k, payload(k));
      ::usleep(2000);
    }
    ::_exit(0);
  }
  while (!fs::exists(killed) || fs::file_size(killed) < min_size) ::usleep(500);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished before it was killed";

  Journal j = Journal::open(killed, "run", true);
  const std::size_t done = j.records().size();
  EXPECT_GT(done, 0u);
  EXPECT_LT(done, static_cast<std::size_t>(kRecords));
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(done); ++k) ASSERT_EQ(j.records().at(k), payload(k));
  for (std::int64_t k = static_cast<std::int64_t>(done); k < kRecords; ++k) j.append(k, payload(k));
  EXPECT_EQ(slurp(killed), slurp(clean));
  j.remove();
  fs::remove(clean);
}

}  // namespace
}  // namespace attnscale
