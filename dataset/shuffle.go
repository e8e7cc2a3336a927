package dataset

import "math/bits"

// Permutation is a keyed pseudo-random bijection of [0, n) that is computed
// point by point in O(1) memory, so a dataset of any size can be shuffled
// without materialising an index array.
//
// # Construction
//
// Let b = max(2, ceil(log2 n)) and split a b-bit value x into a high part L
// of wL bits and a low part R of wR bits (wL+wR = b, wR = ceil(b/2)). One
// Feistel round maps
//
//	x = L<<wR | R   to   y = R<<wL | (L xor F_k(R)) & (2^wL - 1)
//
// where F_k is a keyed 64-bit mixer. The widths of the two halves trade
// places after every round, so unbalanced b (odd bit counts) work too.
//
// # Why it is a bijection of [0, n)
//
// A round is invertible: from y one reads R = y >> wL (the top wR bits) and
// then L = (y & (2^wL-1)) xor F_k(R), whatever F_k is. A composition of
// invertible maps of [0, 2^b) is a permutation P of [0, 2^b).
//
// To restrict P to [0, n) At uses cycle walking: starting from i < n it
// applies P until the value falls below n. This terminates because i lies on
// a finite cycle of P and the walk comes back to i at the latest. The map
// "next in-range element on i's cycle" is a permutation of [0, n): every
// in-range element has exactly one in-range predecessor on its cycle, so no
// two inputs share an output. Since 2^b < 2n (for n > 2), the expected
// number of P evaluations per At is below 2.
//
// The round keys come from (seed, epoch) through splitmix64, so each epoch
// gets an independent-looking order while the same (seed, epoch) always
// gives the same one, on any machine.
type Permutation struct {
	n      uint64
	wHi    uint // width of the high half before round 0
	wLo    uint // width of the low half before round 0
	keys   [feistelRounds]uint64
	hasKey bool // false: identity (used for the unshuffled order)
}

// feistelRounds is the number of Feistel rounds. Four rounds already give
// a pseudo-random permutation in the Luby-Rackoff sense; six leave margin
// for the small half widths of small datasets.
const feistelRounds = 6

// NewPermutation returns the permutation of [0, n) for the given seed and
// epoch. Different epochs of one seed give unrelated orders.
func NewPermutation(n uint64, seed uint64, epoch int64) Permutation {
	p := Permutation{n: n, hasKey: true}
	b := uint(2)
	if n > 4 {
		b = uint(bits.Len64(n - 1))
	}
	p.wLo = (b + 1) / 2
	p.wHi = b - p.wLo
	// Derive the key stream from seed and epoch; both go through the mixer
	// so that neighbouring seeds and epochs are unrelated.
	state := splitmix64(splitmix64(seed) ^ splitmix64(uint64(epoch)+0x632be59bd9b4e019))
	for r := range p.keys {
		state += splitmixGamma
		p.keys[r] = mix64(state)
	}
	return p
}

// IdentityPermutation is the order 0, 1, ..., n-1.
func IdentityPermutation(n uint64) Permutation { return Permutation{n: n} }

// Len is n.
func (p Permutation) Len() uint64 { return p.n }

// At returns the element at position i of the permuted order. It panics if
// i >= Len().
func (p Permutation) At(i uint64) uint64 {
	if i >= p.n {
		panic("dataset: Permutation.At index out of range")
	}
	if !p.hasKey {
		return i
	}
	x := p.feistel(i)
	for x >= p.n { // cycle walking; see the type comment
		x = p.feistel(x)
	}
	return x
}

// feistel applies the permutation P of [0, 2^b).
func (p Permutation) feistel(x uint64) uint64 {
	wHi, wLo := p.wHi, p.wLo
	for r := range p.keys {
		hi := x >> wLo
		lo := x & (1<<wLo - 1)
		// New value: lo becomes the high part, hi xor F(lo) the low part.
		f := mix64(lo ^ p.keys[r])
		x = lo<<wHi | (hi^f)&(1<<wHi-1)
		wHi, wLo = wLo, wHi
	}
	return x
}

// splitmixGamma is the golden-ratio increment of splitmix64.
const splitmixGamma = 0x9e3779b97f4a7c15

// splitmix64 returns the first output of a splitmix64 generator seeded
// with x: a strong 64-bit mixer with good avalanche.
func splitmix64(x uint64) uint64 { return mix64(x + splitmixGamma) }

// mix64 is the splitmix64 output function (a variant of MurmurHash3's
// finalizer); a bijection of uint64.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
