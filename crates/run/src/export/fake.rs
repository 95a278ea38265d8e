//! Realistic fake values for the `fake` transform, chosen from the keyed hash of the value so
//! the same input gives the same fake in every table and run. The word lists are written for
//! larch (common given names and surnames, generic street and place names): nothing copied.
//! Emails use the domains reserved for examples (RFC 2606) and phone numbers the fictional
//! 555-01XX range of the North American plan, so a fake never reaches a real person.

pub use larch_contract::transform_rules::FakeKind;

/// Making a fake of a kind: the exporter's side of [`FakeKind`].
pub trait Generate {
    /// The fake for the keyed bytes `h` (at least 16), at most `max_chars` characters when
    /// that is positive.
    fn generate(self, h: &[u8; 32], max_chars: i64) -> String;
}

impl Generate for FakeKind {
    /// The fake for the keyed bytes `h` (at least 16), at most `max_chars` characters when
    /// that is positive: names and addresses are cut at the limit, an email's local part is
    /// shortened so it stays `local@domain`. Deterministic in `h` and `max_chars`.
    fn generate(self, h: &[u8; 32], max_chars: i64) -> String {
        let pick = |i: usize, list: &'static [&'static str]| -> &'static str {
            let n = u16::from_be_bytes([h[2 * i], h[2 * i + 1]]) as usize;
            list[n % list.len()]
        };
        let number = |i: usize, modulo: u32| -> u32 {
            u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) % modulo
        };
        let first = pick(0, FIRST_NAMES);
        let last = pick(1, LAST_NAMES);
        let out = match self {
            FakeKind::FirstName => first.to_string(),
            FakeKind::LastName => last.to_string(),
            FakeKind::FullName => format!("{first} {last}"),
            FakeKind::Email => {
                let domain = pick(2, EMAIL_DOMAINS);
                let local = format!(
                    "{}.{}{}",
                    first.to_ascii_lowercase(),
                    last.to_ascii_lowercase().replace(['\'', ' '], ""),
                    number(8, 100)
                );
                let room = if max_chars > 0 {
                    (max_chars as usize).saturating_sub(domain.len() + 1).max(1)
                } else {
                    usize::MAX
                };
                let local: String = local.chars().take(room).collect();
                let local = local.trim_end_matches('.');
                return format!("{local}@{domain}");
            }
            FakeKind::Phone => format!("+1 {}-555-01{:02}", 200 + number(8, 800), number(12, 100)),
            FakeKind::StreetAddress => format!(
                "{} {} {}",
                1 + number(8, 9999),
                pick(2, STREETS),
                pick(3, STREET_SUFFIXES)
            ),
            FakeKind::City => pick(2, CITIES).to_string(),
        };
        if max_chars > 0 && out.chars().count() as i64 > max_chars {
            out.chars()
                .take(max_chars as usize)
                .collect::<String>()
                .trim_end()
                .to_string()
        } else {
            out
        }
    }
}

const EMAIL_DOMAINS: &[&str] = &["example.com", "example.org", "example.net"];

const FIRST_NAMES: &[&str] = &[
    "Aaron",
    "Abigail",
    "Adam",
    "Adele",
    "Adrian",
    "Agnes",
    "Aisha",
    "Alan",
    "Albert",
    "Alex",
    "Alice",
    "Alina",
    "Amara",
    "Amelia",
    "Amir",
    "Ana",
    "Andre",
    "Andrea",
    "Angela",
    "Anna",
    "Anton",
    "Arjun",
    "Arthur",
    "Astrid",
    "Aurora",
    "Ben",
    "Bianca",
    "Boris",
    "Brian",
    "Bruno",
    "Camila",
    "Carl",
    "Carla",
    "Carmen",
    "Caroline",
    "Cecilia",
    "Chen",
    "Chloe",
    "Chris",
    "Clara",
    "Colin",
    "Daniel",
    "Dario",
    "David",
    "Diana",
    "Diego",
    "Dmitri",
    "Dora",
    "Edgar",
    "Elena",
    "Eli",
    "Elif",
    "Elise",
    "Emil",
    "Emma",
    "Eric",
    "Erik",
    "Esther",
    "Ethan",
    "Eva",
    "Fatima",
    "Felix",
    "Fiona",
    "Florian",
    "Frances",
    "Frank",
    "Freya",
    "Gabriel",
    "Grace",
    "Greta",
    "Hana",
    "Hannah",
    "Harry",
    "Hassan",
    "Helen",
    "Henry",
    "Hugo",
    "Ian",
    "Ida",
    "Ines",
    "Irene",
    "Isaac",
    "Isabel",
    "Ivan",
    "Jack",
    "Jacob",
    "James",
    "Jana",
    "Jasper",
    "Javier",
    "Jin",
    "Joan",
    "Johan",
    "John",
    "Jonas",
    "Jorge",
    "Julia",
    "Julian",
    "June",
    "Kai",
    "Karen",
    "Karim",
    "Kate",
    "Kenji",
    "Kevin",
    "Kiran",
    "Klara",
    "Lara",
    "Laura",
    "Leah",
    "Lena",
    "Leo",
    "Leon",
    "Lila",
    "Linus",
    "Lisa",
    "Lucas",
    "Lucia",
    "Luis",
    "Luka",
    "Maia",
    "Malik",
    "Marco",
    "Maria",
    "Marek",
    "Marta",
    "Martin",
    "Maya",
    "Mei",
    "Mia",
    "Miguel",
    "Mila",
    "Mina",
    "Mira",
    "Mohammed",
    "Nadia",
    "Naomi",
    "Nathan",
    "Nina",
    "Noah",
    "Nora",
    "Olga",
    "Oliver",
    "Omar",
    "Oscar",
    "Pablo",
    "Paula",
    "Pavel",
    "Peter",
    "Petra",
    "Priya",
    "Rafael",
    "Rahul",
    "Rania",
    "Raul",
    "Rebecca",
    "Rosa",
    "Ruby",
    "Rui",
    "Ruth",
    "Sam",
    "Samir",
    "Sara",
    "Sean",
    "Selma",
    "Sergio",
    "Simon",
    "Sofia",
    "Sonia",
    "Stefan",
    "Susan",
    "Tamar",
    "Tara",
    "Theo",
    "Thomas",
    "Tim",
    "Tomas",
    "Uma",
    "Ursula",
    "Valentina",
    "Vera",
    "Victor",
    "Viktor",
    "Wei",
    "Will",
    "Xavier",
    "Yara",
    "Yasmin",
    "Yuki",
    "Yusuf",
    "Zara",
    "Zoe",
];

const LAST_NAMES: &[&str] = &[
    "Abbott",
    "Adams",
    "Ahmed",
    "Alvarez",
    "Andersen",
    "Arnold",
    "Bailey",
    "Baker",
    "Banerjee",
    "Barnes",
    "Becker",
    "Bell",
    "Berg",
    "Bianchi",
    "Bishop",
    "Blake",
    "Bower",
    "Brandt",
    "Brooks",
    "Brown",
    "Bruno",
    "Burke",
    "Campbell",
    "Carter",
    "Castro",
    "Chan",
    "Chen",
    "Clarke",
    "Cohen",
    "Cole",
    "Collins",
    "Cooper",
    "Costa",
    "Cruz",
    "Dalton",
    "Davies",
    "Dawson",
    "Diaz",
    "Dixon",
    "Dubois",
    "Duncan",
    "Eriksen",
    "Evans",
    "Fischer",
    "Fleming",
    "Flores",
    "Ford",
    "Foster",
    "Fox",
    "Fuchs",
    "Garcia",
    "Gardner",
    "Gill",
    "Gomez",
    "Graham",
    "Grant",
    "Gray",
    "Green",
    "Gupta",
    "Hahn",
    "Hall",
    "Hansen",
    "Harper",
    "Hayes",
    "Hill",
    "Hoffmann",
    "Holt",
    "Horvat",
    "Howard",
    "Hughes",
    "Hunt",
    "Ito",
    "Jensen",
    "Johansson",
    "Jones",
    "Kaur",
    "Keller",
    "Kelly",
    "Khan",
    "Kim",
    "King",
    "Klein",
    "Koch",
    "Kowalski",
    "Kumar",
    "Lambert",
    "Lang",
    "Larsen",
    "Laurent",
    "Lee",
    "Lehmann",
    "Lewis",
    "Lima",
    "Lindqvist",
    "Lopez",
    "Lund",
    "Maier",
    "Marsh",
    "Martin",
    "Mason",
    "Meyer",
    "Miller",
    "Mills",
    "Moreau",
    "Morgan",
    "Morris",
    "Muller",
    "Murphy",
    "Nakamura",
    "Nash",
    "Nguyen",
    "Nielsen",
    "Novak",
    "Okafor",
    "Olsen",
    "Ortiz",
    "Owen",
    "Park",
    "Patel",
    "Perez",
    "Peters",
    "Petrov",
    "Pham",
    "Porter",
    "Price",
    "Quinn",
    "Ramirez",
    "Reed",
    "Reyes",
    "Richter",
    "Rivera",
    "Roberts",
    "Romano",
    "Rossi",
    "Russo",
    "Ryan",
    "Saito",
    "Sanchez",
    "Santos",
    "Sato",
    "Schmidt",
    "Schulz",
    "Scott",
    "Shah",
    "Shaw",
    "Silva",
    "Singh",
    "Smith",
    "Sousa",
    "Stewart",
    "Stone",
    "Suzuki",
    "Svensson",
    "Tanaka",
    "Taylor",
    "Thomas",
    "Torres",
    "Tran",
    "Turner",
    "Vargas",
    "Vasquez",
    "Vogel",
    "Wagner",
    "Walker",
    "Walsh",
    "Wang",
    "Ward",
    "Watson",
    "Weber",
    "Wells",
    "West",
    "White",
    "Wilson",
    "Wolf",
    "Wood",
    "Wright",
    "Yamamoto",
    "Yang",
    "Young",
    "Zhang",
    "Zimmermann",
];

const STREETS: &[&str] = &[
    "Acacia", "Alder", "Apple", "Ash", "Aspen", "Bay", "Beech", "Birch", "Bridge", "Brook",
    "Cedar", "Cherry", "Chestnut", "Church", "Cliff", "Clover", "Cove", "Crescent", "Dale", "Elm",
    "Fern", "Field", "Forest", "Garden", "Glen", "Grove", "Harbor", "Hawthorn", "Hazel", "Heather",
    "Highland", "Hill", "Holly", "Juniper", "Lake", "Laurel", "Lilac", "Linden", "Maple", "Meadow",
    "Mill", "Oak", "Orchard", "Park", "Pine", "Poplar", "Quarry", "Railway", "Ridge", "River",
    "Rose", "School", "Spring", "Spruce", "Station", "Sunset", "Valley", "Willow", "Windmill",
    "Yew",
];

const STREET_SUFFIXES: &[&str] = &[
    "Street", "Avenue", "Road", "Lane", "Drive", "Way", "Court", "Place", "Terrace", "Close",
];

const CITIES: &[&str] = &[
    "Ashford",
    "Bayview",
    "Beacon Hill",
    "Bellmont",
    "Birchwood",
    "Blackwater",
    "Bramley",
    "Bridgeport",
    "Brookfield",
    "Cedar Falls",
    "Clearwater",
    "Cliffside",
    "Coldbrook",
    "Crestview",
    "Dalewood",
    "Deerfield",
    "Eastbourne",
    "Eastwick",
    "Elmhurst",
    "Fairhaven",
    "Fairview",
    "Fernley",
    "Foxborough",
    "Glendale",
    "Goldhill",
    "Granite Bay",
    "Greenfield",
    "Harborview",
    "Hawthorne",
    "Highbury",
    "Hillcrest",
    "Holloway",
    "Ironwood",
    "Kingsbridge",
    "Lakeside",
    "Larkspur",
    "Linwood",
    "Maplewood",
    "Marlow",
    "Meadowbrook",
    "Millbrook",
    "Milton",
    "Mossbank",
    "Newbury",
    "Northfield",
    "Oakdale",
    "Oakridge",
    "Old Harbor",
    "Orchard Park",
    "Pinecrest",
    "Pinehurst",
    "Port Ellis",
    "Redcliff",
    "Ridgeway",
    "Riverside",
    "Rockport",
    "Rosedale",
    "Saltmarsh",
    "Sandown",
    "Shelby",
    "Silverlake",
    "Southgate",
    "Springfield",
    "Stonebridge",
    "Summerton",
    "Sunnyvale",
    "Thornbury",
    "Timberline",
    "Upton",
    "Valemont",
    "Westbrook",
    "Westfield",
    "Whitby",
    "Willowdale",
    "Windham",
    "Woodbury",
    "Woodhaven",
    "Yarrow",
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn bytes(i: u32) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        Sha256::digest(i.to_be_bytes()).into()
    }

    #[test]
    fn lists_are_long_enough_and_unique() {
        for (name, list, min) in [
            ("first", FIRST_NAMES, 150),
            ("last", LAST_NAMES, 150),
            ("streets", STREETS, 50),
            ("cities", CITIES, 60),
        ] {
            assert!(list.len() >= min, "{name}: {}", list.len());
            let set: std::collections::HashSet<_> = list.iter().collect();
            assert_eq!(set.len(), list.len(), "{name} has duplicates");
        }
    }

    #[test]
    fn no_value_is_more_than_a_few_percent() {
        let n = 20_000;
        for kind in FakeKind::ALL {
            let mut counts: HashMap<String, usize> = HashMap::new();
            for i in 0..n {
                *counts.entry(kind.generate(&bytes(i), 0)).or_default() += 1;
            }
            let top = counts.values().max().copied().unwrap();
            // City has the shortest list (~80): about 1.3 % each.
            assert!(
                top * 100 <= n as usize * 3,
                "{kind}: the most frequent value has {top} of {n}"
            );
        }
    }

    #[test]
    fn fakes_have_their_shape_and_fit_the_limit() {
        for i in 0..2000 {
            let h = bytes(i);
            let email = FakeKind::Email.generate(&h, 0);
            let (local, domain) = email.split_once('@').unwrap();
            assert!(
                !local.is_empty() && EMAIL_DOMAINS.contains(&domain),
                "{email}"
            );
            assert!(email.is_ascii() && !email.contains(' '), "{email}");
            let phone = FakeKind::Phone.generate(&h, 0);
            assert_eq!(phone.len(), 15, "{phone}");
            assert!(
                phone.starts_with("+1 ") && phone[6..].starts_with("-555-01"),
                "{phone}"
            );
            let full = FakeKind::FullName.generate(&h, 0);
            assert_eq!(full.split(' ').count(), 2, "{full}");
            for kind in FakeKind::ALL {
                // Limits below min_length are refused when the rules are compiled.
                let m = kind.min_length();
                for limit in [m, m + 3, 20.max(m)] {
                    let v = kind.generate(&h, limit);
                    assert!(v.chars().count() as i64 <= limit, "{kind}/{limit}: {v}");
                    assert!(!v.is_empty() && !v.ends_with(' '), "{kind}/{limit}: {v:?}");
                }
            }
            let short = FakeKind::Email.generate(&h, FakeKind::Email.min_length());
            assert!(short.contains('@') && !short.split_once('@').unwrap().0.is_empty());
        }
    }
}
