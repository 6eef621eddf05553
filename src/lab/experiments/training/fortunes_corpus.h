// The character-level language-model task's text: Debian's `fortunes` package (English quotations,
// about 2.4 MB in /usr/share/games/fortunes), read byte by byte.
//
// Fixed split: every file without an extension in the folder, in byte order of the file names, is
// cut into its fortunes (separated by lines holding one '%'); fortune number i of the whole list
// (counting from 0) goes to validation when i % 10 == 9, the others to training, each fortune
// followed by "\n%\n" as in the files. The vocabulary is every byte value (V = 256).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attnscale::lab::training {

struct Corpus {
  std::string train, validation;
  std::int64_t fortunes = 0;  // in both parts
};

// Throws Error naming the folder when it holds no fortune files. Loaded once per folder.
const Corpus& fortunes_corpus(const std::string& folder);

}  // namespace attnscale::lab::training
